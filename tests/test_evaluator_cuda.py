"""CUDA candidates: static checks (everywhere), nvcc builds (where nvcc is, as on CI), and the
evaluator's behaviour on a machine without a GPU. Running them is the H200 bench's job
(bench/evaluator_bench.py)."""

import shutil
from pathlib import Path

import pytest

from forge_tui.evaluator.build import Builder
from forge_tui.evaluator.diagnostics import parse, resources
from forge_tui.evaluator.static_checks import check_source, errors

CUDA = Path(__file__).parent / "candidates" / "cuda"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

# file -> the static rule that rejects it (None: passes the static checks; runtime checks decide)
EXPECTED_STATIC = {
    "softmax_good.cu": None,
    "never_writes.cu": None,            # 1: caught at run time (poisoned outputs)
    "uninit_shared.cu": None,           # 2: run time
    "skip_rows.cu": None,               # 4: run time
    "mutate_input.cu": None,            # 5: run time
    "cache_by_pointer.cu": "no-state",  # 8
    "batch_and_skip.cu": "no-state",    # 9
    "side_stream.cu": "no-streams",     # 10
    "background_thread.cu": "no-threads",  # 11
    "no_kernel.cu": "kernel",           # 13
    "not_launched.cu": "kernel",        # 13
    "library_call.cu": "library",       # 13
    "downcast_bf16.cu": None,           # 15: run time (fp32 tolerance)
    "illegal_address.cu": None,         # crash: run time
    "endless.cu": None,                 # hang: run time
    "judge_python.cu": None,            # the judge in reach: fails to load in the runner
    "spawn_busy.cu": "no-threads",      # a busy process to slow the baseline: refused by seccomp
    "device_state.cu": "no-state",      # state in a device variable template: fresh inputs catch it too
    "late_kernel.cu": "no-threads",     # work launched after the call returned: late writes
    "softmax_no_max.cu": None,          # no max subtraction: the overflow input set catches it
}


def test_every_cuda_candidate_is_listed():
    assert sorted(p.name for p in CUDA.glob("*.cu")) == sorted(EXPECTED_STATIC)


@pytest.mark.parametrize("name, rule", sorted(EXPECTED_STATIC.items()))
def test_static_rules(name, rule):
    findings = check_source((CUDA / name).read_text(), "cuda")
    errs = errors(findings)
    if rule is None:
        assert errs == [], [str(f) for f in errs]
    else:
        assert any(f.rule == rule for f in errs), [str(f) for f in findings]


def test_library_calls_allowed_when_the_card_allows():
    findings = check_source((CUDA / "library_call.cu").read_text(), "cuda", allow_libraries=True)
    assert not errors(findings) and any(f.rule == "library" for f in findings)


@needs_nvcc
def test_nvcc_builds_the_honest_candidate_and_a_cheat(tmp_path):
    """The default suite's share of the test below: the honest softmax and one cheat build."""
    _nvcc_builds_candidates(tmp_path, every=False)


@pytest.mark.exhaustive
@needs_nvcc
def test_nvcc_builds_every_candidate(tmp_path):
    """Every CUDA candidate is a real, compilable program (built for sm_90, in parallel); the
    cuBLAS one needs the library's headers, which not every toolkit install has."""
    _nvcc_builds_candidates(tmp_path, every=True)


def _nvcc_builds_candidates(tmp_path, every: bool) -> None:
    b = Builder("cuda", tmp_path, arch="sm_90")
    names = sorted(n for n in EXPECTED_STATIC if n != "library_call.cu")
    if not every:
        names = ["softmax_good.cu", next(n for n in names if n != "softmax_good.cu")]
    results = b.build_many([(CUDA / n).read_text() for n in names])
    for name, r in zip(names, results):
        assert r.ok, (name, r.reason, r.log[-500:])
        assert r.library.exists()
    good = results[names.index("softmax_good.cu")]
    (kernel, res), = good.resources.items()
    assert "softmax_rows" in kernel and res["registers"] > 0 and res["spill_store_bytes"] == 0
    again = b.build((CUDA / "softmax_good.cu").read_text())
    assert again.cached and again.library == good.library


@needs_nvcc
def test_nvcc_errors_are_parsed(tmp_path):
    src = (CUDA / "softmax_good.cu").read_text().replace("expf(a[c] - m) * inv", "expf(a[c] - m) * nope")
    r = Builder("cuda", tmp_path, arch="sm_90").build(src)
    assert not r.ok
    line = next(i for i, t in enumerate(src.splitlines(), 1) if "* nope" in t)
    err = next(d for d in r.diagnostics if d.severity == "error")
    assert err.line == line and "nope" in err.message and err.file.endswith("candidate.cu")


@needs_nvcc
def test_cuda_backend_without_gpu_reports_no_device(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from forge_tui.cards import Card
    from forge_tui.evaluator import Evaluator
    from forge_tui.tensorstore import TensorStore

    card = Card(id="x", kind="op", target="aten._softmax.default", label="", inputs=[], outputs=[],
                program={"nodes": [], "outputs": []})
    with Evaluator(TensorStore(tmp_path / "t"), tmp_path, backend="cuda") as ev:
        r = ev.evaluate(card, (CUDA / "softmax_good.cu").read_text())
    assert r.status == "error" and r.failure == "no_device" and r.build.ok


def test_diagnostics_parser_formats():
    text = "\n".join([
        'candidate.cu(12): error: identifier "zz" is undefined',
        "candidate.cu(3): warning #177-D: variable \"q\" was declared but never referenced",
        "candidate.cpp:7:5: error: 'x' was not declared in this scope",
        "ptxas error   : Entry function '_Z1kPf' uses too much shared data (0x10000 bytes, 0xc000 max)",
        "/usr/bin/ld: candidate.o: undefined reference to `foo'",
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'",
        "ptxas info    : Function properties for _Z1kPf",
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads",
        "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 364 bytes cmem[0]",
    ])
    d = parse(text)
    assert [(x.file, x.line, x.column, x.severity) for x in d] == [
        ("candidate.cu", 12, None, "error"), ("candidate.cu", 3, None, "warning"),
        ("candidate.cpp", 7, 5, "error"), ("ptxas", None, None, "error"), ("ld", None, None, "error")]
    assert resources(text) == {"_Z1kPf": {"stack_bytes": 8, "spill_store_bytes": 4, "spill_load_bytes": 4,
                                          "registers": 40, "shared_bytes": 1024}}
