"""The static check of state kept across calls (``static_checks.state_findings``): every form a
memo can hide in is refused with a reason that names it, and no honest source is: the hand-written
families' and the code generator's, for every card of the bundled workloads they serve, on both
backends, in their first configuration (and every one-step move from it on a family's first card)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge_tui.evaluator.static_checks import check_source, errors

HERE = Path(__file__).parent
ENTRY = ("FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,\n"
         "                              const forge_scalar* sc, int32_t n_sc, void* stream) {\n{body}\n    return 0;\n}\n")


def source(top: str = "", body: str = "") -> str:
    return '#include "forge_kernel.h"\n' + top + "\n" + ENTRY.replace("{body}", body)


def flagged(src: str, backend: str = "cpu") -> list[str]:
    return [f"{f.rule}: {f.message}" for f in errors(check_source(src, backend))]


# (what, source, words the refusal holds): each a place a memo keyed on its input survives in
MEMO_FORMS = [
    ("static pointer", source(body="    static float* const memo = new float[1 << 20];"),
     "static variable memo is a fixed pointer to writable storage"),
    ("static pointer at file scope", source("static float* const memo = (float*)malloc(1 << 20);"),
     "global variable memo is a fixed pointer to writable storage"),
    ("inline member", source("struct Memo { static inline float buf[4096]; static inline long key = 0; };"),
     "static data member buf is writable"),
    ("template static", source("template <typename T> struct Memo { static T* slot; };\n"
                               "template <typename T> T* Memo<T>::slot = nullptr;"),
     "static data member slot is a writable pointer"),
    ("template static definition", source("template <typename T> struct Memo { static T* slot; };\n"
                                          "template <typename T> T* Memo<T>::slot = nullptr;"),
     "global variable slot is a writable pointer"),
    ("variable template", source("template <int N> float memo[N];"), "global variable memo is writable"),
    ("extern initialiser", source("extern float memo[4096] = {0};"), "global variable memo is writable"),
    ("extern \"C\" initialiser", source('extern "C" float memo[4096] = {};'), "global variable memo is writable"),
    ("descriptor slot", source(body="    out[0].shape[7] = (int64_t)malloc(64);"),
     "writes out[0].shape[7]: the forge_tensor descriptors are the runner's own"),
    ("descriptor slot through a local pointer", source(body="    forge_tensor* o = &out[0];\n    forge_tensor* p = o;\n"
                                                             "    p->stride[7] = 1;"),
     "writes p->stride[7]: the forge_tensor descriptors are the runner's own"),
    ("descriptor slot through a cast", source(body="    ((forge_tensor*)in)[0].stride[7] = 1;"),
     "casts the const away from the forge_tensor descriptors"),
    ("scalar slot", source(body="    const_cast<forge_scalar*>(sc)[0].reserved = 1;"),
     "casts the const away from the forge_scalar descriptors"),
    ("temp file", source(body="    FILE* f = tmpfile();"), "calls tmpfile"),
    ("temp file by name", source(body="    char p[] = \"/tmp/mXXXXXX\"; int fd = mkstemp(p);"), "calls mkstemp"),
    ("file stream", source("#include <fstream>", "    std::ofstream f(\"/tmp/memo\");"), "uses std::ofstream"),
    ("environment", source(body="    setenv(\"FORGE_MEMO\", \"1\", 1);"), "calls setenv"),
    ("environment table", source("extern char** environ;", "    environ[0][0] = 'x';"), "uses environ"),
    ("thread_local", source(body="    thread_local long calls = 0; ++calls;"), "thread_local variable calls is writable"),
    ("mutable member", source("static const struct { mutable float buf[64]; } memo = {};"), "mutable member buf"),
]


@pytest.mark.parametrize("what, src, words", MEMO_FORMS, ids=[m[0] for m in MEMO_FORMS])
def test_every_form_of_kept_state_is_refused(what, src, words):
    reasons = flagged(src)
    assert any(words in r for r in reasons), (what, reasons)


CUDA_FORMS = [
    ("__device__ global", "__device__ float memo[1 << 20];\n__device__ unsigned long long memo_key;",
     "__device__ global variable memo_key is"),
    ("__device__ variable template", "template <int N> __device__ float memo[N];",
     "__device__ global variable memo is writable"),
    ("__device__ static member", "struct Memo { static __device__ float key; };", "static data member key is writable"),
    ("__managed__ in a namespace", "namespace memo { __managed__ float key; }", "global variable key is"),
]
KERNEL = ("__global__ void k(float* y) { y[threadIdx.x] = 0.f; }\n")


@pytest.mark.parametrize("what, top, words", CUDA_FORMS, ids=[m[0] for m in CUDA_FORMS])
def test_device_memory_kept_across_calls_is_refused(what, top, words):
    src = source(top + "\n" + KERNEL, "    k<<<1, 32, 0, (cudaStream_t)stream>>>((float*)out[0].data);")
    reasons = flagged(src, "cuda")
    assert any(words in r for r in reasons), (what, reasons)


def test_what_cannot_change_or_is_the_calls_own_is_not_state():
    src = source(
        "static const float TABLE[4] = {1, 2, 3, 4};\n"
        "static constexpr int WIDTH = 8;\n"
        "static const float* const FIRST = TABLE;\n"
        "const char* const NAME = \"softmax\";\n"
        "static float* const NOWHERE = nullptr;\n"
        "struct Limits { static constexpr int N = 4; static const int M = 2; };\n"
        "static inline float twice(float x) { return 2 * x; }\n"
        "extern \"C\" int helper(int);\n",
        "    forge_tensor view = in[0];\n"
        "    view.shape[0] = 1; view.ndim = 1;\n"
        "    const forge_tensor* x = &in[0];\n"
        "    int64_t rows = x->shape[0];\n"
        "    static const int steps = 3;\n"
        "    float* y = (float*)out[0].data;\n"
        "    y[0] = twice(TABLE[0]);")
    assert flagged(src) == []
    cuda = source("extern __shared__ float smem[];\n__constant__ float COEF[2] = {1.f, 2.f};\n"
                  "__global__ void k(float* y) { extern __shared__ float tile[]; tile[0] = COEF[0]; y[0] = tile[0]; }",
                  "    k<<<1, 32, 64, (cudaStream_t)stream>>>((float*)out[0].data);")
    assert flagged(cuda, "cuda") == []


@pytest.fixture(scope="module")
def family_cards(tmp_path_factory, decoder_workspace):
    """Every card of the families workload, the tiny decoder and the generator's module workload
    (module, chain and op cards: what the code generator serves), profiled once."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("state")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n")
    cards = list(decoder_workspace.cards())
    for name in ("families", "codegen_modules"):
        ws, _ = profile_into_workspace(HERE / "data" / "workloads" / f"{name}.py", root / name, device="cpu",
                                       config_path=cfg)
        cards.extend(ws.cards())
    return cards


def test_every_family_and_the_generators_sources_pass(family_cards):
    from forge_tui.templates.proposer import TemplateProposer
    from forge_tui.templates.registry import matches

    seen: dict[str, int] = {}
    sources: dict[str, tuple] = {}
    moved: set[tuple[str, str]] = set()
    taken: dict[tuple[str, str, str], int] = {}
    for card in family_cards:
        for fam, m in matches(card):
            for backend in ("cpu", "cuda"):
                # eight cards of each kind a family serves, a backend (the checks take ~0.1 s a source)
                group = (fam.name, card.kind, backend)
                if taken.get(group, 0) >= 8:
                    continue
                taken[group] = taken.get(group, 0) + 1
                p0 = fam.initial(m, backend)
                # every card's first configuration; every one-step move from it on a family's first card
                moves = [] if (fam.name, backend) in moved else TemplateProposer().neighbours(fam, m, p0, backend)
                moved.add((fam.name, backend))
                for params in [p0] + moves:
                    src = fam.render(m, params, backend)
                    sources.setdefault(src, (fam.name, card.id, backend, params))
                    seen[fam.name] = seen.get(fam.name, 0) + 1
    bad = [(what, reasons[:2]) for src, what in sources.items() if (reasons := flagged(src, what[2]))]
    assert not bad, bad[:3]
    families = {"softmax", "rownorm", "group_norm", "batch_norm", "avg_pool", "max_pool", "elementwise", "generated"}
    assert families <= set(seen), seen
    assert seen["generated"] >= 20 and len(sources) >= 100, (seen, len(sources))
