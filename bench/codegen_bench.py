"""The code generator (issue 17) on real module cards: collect the module cards whose captured
program the generator can express (pointwise ops, casts, index-arithmetic views, reductions), from
the bundled GPU examples and, where ``transformers`` is importable, from leaf modules of its model
classes built from their configurations (random weights, no download); run a template search of
up to N evaluations on each (hand-written families keep priority, the generated family serves the
rest) and report eager, torch.compile and our best with spread, the evaluations to the first
correct kernel, the share of a same-size device copy reached, and the issue's targets.

    python bench/codegen_bench.py [--sources NAME ...] [--cases PATTERN ...] [--evals 20]
                                  [--case-wall S] [--budget-s 540] [--run-timeout S]
    python bench/codegen_bench.py --device cpu --small          # this machine, well under 2 minutes

Sources (cuda): the examples decoder, resnet50, diffusion, moe, and ``transformers``; with
--small: ``modules`` (tests/data/workloads/codegen_modules.py), the tiny_* examples, and
``transformers`` at small shapes when importable. Case names are ``source/Module/dtype/shape``;
--cases keeps the cases whose name contains one of the patterns (a pattern with a ``/`` profiles
only the sources its first part names: ``--cases decoder/RMSNorm transformers/`` profiles two).

Every evaluation is printed as it lands. Cases run in turns over the sources (each source's
largest card first), each with up to --case-wall seconds; --budget-s bounds the whole run (the
profiles included) so that it fits one 10-minute device call: cases that no longer fit are
skipped with a line saying so. Writes $OUT/codegen.json (codegen_cpu.json on the cpu) after every
case, so a run cut short keeps what it finished, and prints a table last.

On the device machine (no package registry), the project's pure-Python dependencies travel as
wheels: run ``../shared/device/wheels.sh`` here once (it fills ./.whl), carry ``.whl``, and start
the command with that script's install line; the script imports forge_tui from this checkout.
One call of at most 10 minutes (carry [".whl"], timeout 600):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; set -o pipefail;
    PYTHONUNBUFFERED=1 python3 bench/codegen_bench.py --sources decoder transformers diffusion \
      --case-wall 40 --budget-s 530 2>&1 | tee $OUT/codegen.log

(--list profiles and lists the cases without searching; the moe example's cards are HF RMSNorms
that the hand-written rms_norm family serves, and its profile is the slowest; ResNet-50's batch
norms make op cards, not module cards: --op-cards --sources resnet50 runs those.)

Targets (issue 17, cuda): a correct kernel within the evaluations; at large shapes (the card moves
at least --large-mib) at least 85% of a same-size copy; faster than torch.compile, or within 3% of
it where torch.compile already reaches 90% of the same-size copy. cpu: faster than eager.

The same-size copy, three ways: ``%copy``, torch's copy timed in the judge's process against our
evaluator time (a round trip to the candidate's process in it); ``%cand``, a copy kernel timed as
a candidate, through that round trip too (large cards); ``%dev``, device time against device time
(CUDA events, our best kernel loaded into this process, every case on cuda). The 85% target reads
the first of ``%dev``, ``%cand``, ``%copy`` measured.

torch.compile, two ways: ``vs compile``, the evaluator's, a call's latency (torch.compile's call of
the card alone pays its guards and wrappers on the host, which a compiled model pays once a graph);
``dev vs c``, device time against device time in this process (``device_times_us``: the device
held busy while the host enqueues each call), what a compiled model's graph gets from our kernel in
the place of torch.compile's. The torch.compile target reads ``dev vs c`` where measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# in this order: the cases run in turns over the sources, so a run cut short has each one's
# biggest card; moe, whose profile is the slowest, last
GPU_SOURCES = ["decoder", "transformers", "resnet50", "diffusion", "moe"]
END_MARGIN_S = 30.0
"""A case's wall limit leaves this much of the budget: a search stopped by its limit still waits
for the evaluations in flight."""
SMALL_SOURCES = ["modules_wide", "modules", "tiny_diffusion", "tiny_decoder", "transformers"]
MODULES_WORKLOAD = ROOT / "tests" / "data" / "workloads" / "codegen_modules.py"
# --small without --cases: the module table's classes at CPU-sized shapes (norms, rotary, gates,
# fills, a group norm written by hand), one tiny table card and a tiny example's group norm
SMALL_CASES = ["modules_wide/", "modules/HandGroupNorm/", "tiny_diffusion/GroupNorm/", "transformers/"]
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}

CONFIG = """
[timing]
warmup = {warmup}
repeats = {repeats}
threads = {threads}

[profile]
ops = {ops}
samples_per_card = 1
max_sample_mib = {max_sample_mib}
"""

# The module table's classes (tests/data/workloads/codegen_modules.py) at shapes where a CPU
# kernel's time is well above the timer's resolution: the cpu backend's "fused beats eager".
WIDE_WORKLOAD = '''
import importlib.util

import torch

_spec = importlib.util.spec_from_file_location("codegen_modules_table", {path!r})
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)
R, H = 512, 2048
B, NH, S, D = 4, 8, 128, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gemma_norm_bf16 = m.GemmaRMSNorm(H).to(torch.bfloat16)
        self.t5_norm = m.T5LayerNorm(H)
        self.rotary = m.Rotary()
        self.softcap = m.SoftCap()
        self.swiglu = m.ChunkSwiGLU()
        self.group_norm = m.HandGroupNorm(8, 64)
        self.add_norm = m.AddRMSNorm(H)
        self.masked_scale = m.MaskedScale()
        self.standardize = m.Standardize()

    def forward(self, x, q, cos, sin, img, mask):
        bf = x.to(torch.bfloat16)
        return [self.gemma_norm_bf16(bf), self.t5_norm(x), self.rotary(q, cos, sin), self.softcap(bf * 40.0),
                self.swiglu(x), self.group_norm(img), self.add_norm(x, x * 0.5),
                self.masked_scale(x, x[:, 0], x[0], mask), self.standardize(x)]


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    g = torch.Generator().manual_seed(1)
    pos = torch.arange(S, dtype=torch.float32)[None, :, None]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    emb = torch.cat(((pos * inv[None, None, :]).expand(B, S, D // 2),) * 2, dim=-1)
    return [torch.randn(R, H, generator=g), torch.randn(B, NH, S, D, generator=g), emb.cos(), emb.sin(),
            torch.randn(4, 64, 32, 32, generator=g), torch.rand(R, H, generator=g) < 0.3]
'''

# Leaf modules of transformers' model classes, built from their configurations with random
# weights. Nothing here tells the generator a class name: each is profiled into a module card
# and the card's captured aten program is all the search sees. {B}, {S}: batch and sequence.
TRANSFORMERS_WORKLOAD = '''
import importlib

import torch
from torch import nn

DTYPE = torch.bfloat16
B, S = {B}, {S}
SMALL = {small}


def _cls(module, name):
    return getattr(importlib.import_module(module), name)


class RotaryApplied(nn.Module):
    """The models' apply_rotary_pos_emb (q and k), as their attention calls it."""

    def __init__(self, fn):
        super().__init__()
        self._fn = (fn,)  # a plain function: not a submodule

    def forward(self, q, k, cos, sin):
        return self._fn[0](q, k, cos, sin)


class GateAct(nn.Module):
    """The MLP's gate: act_fn(gate_proj(x)) * up_proj(x), the projections' outputs as inputs; the
    activation is the model's own (ACT2FN[config.hidden_act]), not a submodule, so this is a leaf."""

    def __init__(self, act):
        super().__init__()
        self._act = (act,)

    def forward(self, gate, up):
        return self._act[0](gate) * up


def _entries():
    """(name, module, [input shapes]) for every piece this transformers version has."""
    out, errors = [], []

    def add(name, build):
        try:
            out.append((name, *build()))
        except Exception as exc:  # a class this version lacks or builds differently: skip it
            errors.append(f"{{name}}: {{type(exc).__name__}}: {{str(exc)[:160]}}")

    def gemma3():
        cfg = _cls("transformers", "Gemma3TextConfig")(hidden_size=64 if SMALL else 1536, intermediate_size=128 if SMALL else 6144,
                                                       num_attention_heads=4 if SMALL else 8, num_key_value_heads=2 if SMALL else 4,
                                                       head_dim=16 if SMALL else 256)
        norm = _cls("transformers.models.gemma3.modeling_gemma3", "Gemma3RMSNorm")
        return cfg, norm

    def gemma3_norm():
        cfg, norm = gemma3()
        return norm(cfg.hidden_size, eps=cfg.rms_norm_eps), [(B, S, cfg.hidden_size)]

    def gemma3_qnorm():
        cfg, norm = gemma3()
        return norm(cfg.head_dim, eps=cfg.rms_norm_eps), [(B, S, cfg.num_attention_heads, cfg.head_dim)]

    def gemma3_gate():
        cfg, _ = gemma3()
        act = _cls("transformers.activations", "ACT2FN")[cfg.hidden_activation]
        return GateAct(act), [(B, S, cfg.intermediate_size)] * 2

    def llama():
        return _cls("transformers", "LlamaConfig")(hidden_size=64 if SMALL else 4096, intermediate_size=128 if SMALL else 11008,
                                                   num_attention_heads=4 if SMALL else 32, num_key_value_heads=2 if SMALL else 8)

    def llama_norm():
        cfg = llama()
        norm = _cls("transformers.models.llama.modeling_llama", "LlamaRMSNorm")
        return norm(cfg.hidden_size, eps=cfg.rms_norm_eps), [(B, S, cfg.hidden_size)]

    def llama_rotary():
        cfg = llama()
        fn = _cls("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
        hd = cfg.hidden_size // cfg.num_attention_heads
        return RotaryApplied(fn), [(B, cfg.num_attention_heads, S, hd), (B, cfg.num_key_value_heads, S, hd),
                                   ("cos", B, S, hd), ("sin", B, S, hd)]

    def llama_rotary_mha():  # as many k heads as q heads (Llama-2-7B): both outputs one size
        cfg = llama()
        fn = _cls("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
        hd = cfg.hidden_size // cfg.num_attention_heads
        return RotaryApplied(fn), [(B, cfg.num_attention_heads, S, hd)] * 2 + [("cos", B, S, hd), ("sin", B, S, hd)]

    def llama_gate():
        cfg = llama()
        act = _cls("transformers.activations", "ACT2FN")[cfg.hidden_act]
        return GateAct(act), [(B, S, cfg.intermediate_size)] * 2

    def qwen3_qnorm():
        cfg = _cls("transformers", "Qwen3Config")(hidden_size=64 if SMALL else 2048, num_attention_heads=4 if SMALL else 16,
                                                  num_key_value_heads=2 if SMALL else 8, head_dim=16 if SMALL else 128)
        norm = _cls("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm")
        return norm(cfg.head_dim, eps=cfg.rms_norm_eps), [(B, S, cfg.num_attention_heads, cfg.head_dim)]

    def t5_norm():
        cfg = _cls("transformers", "T5Config")(d_model=64 if SMALL else 1024)
        norm = _cls("transformers.models.t5.modeling_t5", "T5LayerNorm")
        return norm(cfg.d_model, eps=cfg.layer_norm_epsilon), [(B, S, cfg.d_model)]

    def gpt2_gelu():
        cfg = _cls("transformers", "GPT2Config")(n_embd=64 if SMALL else 768)
        act = _cls("transformers.activations", "ACT2FN")[cfg.activation_function]
        return act, [(B, S, 4 * cfg.n_embd)]

    def clip_quick_gelu():
        cfg = _cls("transformers", "CLIPTextConfig")(hidden_size=64 if SMALL else 512, intermediate_size=128 if SMALL else 2048)
        act = _cls("transformers.activations", "ACT2FN")[cfg.hidden_act]
        return act, [(B, S, cfg.intermediate_size)]

    for name, build in [("gemma3_norm", gemma3_norm), ("gemma3_qnorm", gemma3_qnorm), ("gemma3_gate", gemma3_gate),
                        ("llama_norm", llama_norm), ("llama_rotary", llama_rotary), ("llama_rotary_mha", llama_rotary_mha),
                        ("llama_gate", llama_gate),
                        ("qwen3_qnorm", qwen3_qnorm), ("t5_norm", t5_norm), ("gpt2_gelu", gpt2_gelu),
                        ("clip_quick_gelu", clip_quick_gelu)]:
        add(name, build)
    return out, errors


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        entries, errors = _entries()
        for e in errors:
            print(f"transformers piece skipped: {{e}}", flush=True)
        self.names = [e[0] for e in entries]
        self.shapes = [e[2] for e in entries]
        self.pieces = nn.ModuleDict({{name: mod for name, mod, _ in entries}})
        for p in self.parameters():  # random weights, around what trained norms hold
            nn.init.normal_(p, mean=0.0 if p.abs().max() == 0 else 1.0, std=0.1)

    def forward(self, *args):
        outs, k = [], 0
        for name, shapes in zip(self.names, self.shapes):
            n = len(shapes)
            r = self.pieces[name](*args[k:k + n])
            outs.extend(r if isinstance(r, tuple) else [r])
            k += n
        return tuple(outs)


def _cos_sin(shape):
    b, s, d = shape
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    f = torch.arange(s).float()[:, None] * inv[None, :]
    emb = torch.cat((f, f), dim=-1)[None].expand(b, s, d)
    return emb.cos(), emb.sin()


def get_model(device="cpu"):
    with torch.device(device):
        return Model()


def get_inputs(device="cpu"):
    shapes = [e[2] for e in _entries()[0]]
    out = []
    with torch.device(device):
        for group in shapes:
            for s in group:
                if s and s[0] == "cos":
                    out.append(_cos_sin(s[1:])[0])
                elif s and s[0] == "sin":
                    out.append(_cos_sin(s[1:])[1])
                else:
                    out.append(torch.randn(*s))
    return out
'''


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means: not this source
        return False
    return True


def same_size_copy_us(nbytes: int, device: str, threads: int = 0) -> float:
    """Median time (µs) of a copy reading and writing as many bytes as the card moves (nbytes / 2
    each way), timed like the candidates: the floor a kernel can actually reach (on cuda, the
    approach of templates_bench.py)."""
    if device == "cuda":
        from templates_bench import same_size_copy_us as cuda_copy_us

        return cuda_copy_us(nbytes)
    import torch

    from forge_tui.timing import Timer

    if threads:
        torch.set_num_threads(threads)  # as many threads as eager and our kernels get
    n = max(16, nbytes // 2 // 16 * 16)
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    stats, _, _ = Timer("cpu", warmup=3, repeats=30).time({"copy": lambda: dst.copy_(src)})
    return stats["copy"].median



def load_node(ws, card, commit: str, backend: str):
    """The node's kernel built again and loaded into this process, bound to the card's captured
    inputs and fresh outputs: (a no-argument launcher returning forge_launch's code, inputs,
    outputs). None where the node has no source for the backend or it does not build."""
    import torch

    from forge_tui.evaluator.build import Builder
    from forge_tui.inputs import sample_inputs
    from forge_tui.kernel_abi import SOURCE_NAMES, Library, alloc_outputs, card_scalars, workspace_for
    from forge_tui.search.store import SearchStore

    with ws.git() as repo:
        try:
            src = SearchStore(repo).read(commit, SOURCE_NAMES[backend]).decode()
        except Exception:  # noqa: BLE001 - a node without a source for this backend
            return None
    built = Builder(backend, ws.cache).build(src)
    if not built.ok:
        return None
    lib = Library(built.library)
    ins = sample_inputs(card, ws.store, 0, backend)
    outs = alloc_outputs(card.outputs, backend)
    scalars = card_scalars(card.program)
    stream = torch.cuda.current_stream().cuda_stream if backend == "cuda" else None
    return lib.bind(ins, outs, scalars, stream, workspace_for(lib, ins, outs, scalars, backend)), ins, outs


def outputs_match(card, ws, loaded) -> bool:
    """Whether the loaded kernel's outputs (after its last call) are eager's captured outputs for
    the same inputs, within the evaluator's default tolerance: the kernel timed is the one judged."""
    from forge_tui.compare import compare
    from forge_tui.inputs import sample_outputs

    _, ins, outs = loaded
    want = sample_outputs(card, ws.store, 0, ins[0].device.type if ins else "cpu")
    return all(compare(o, e, i) is None for i, (o, e) in enumerate(zip(outs, want)))


def interleaved_device_us(fns: dict, reps: int, launches, timer=None) -> tuple[dict, dict]:
    """Each function's device time (CUDA events, L2 flushed before each call), the functions in
    turn round after round, three rounds of warm-up left out: medians and quartiles, µs.
    ``launches(name)``: whether that function returns forge_launch's code (0 or an error)."""
    import torch

    from forge_tui.timing import Timer

    timer = timer or Timer("cuda", cold_l2=True)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(reps + 3):
        for name, fn in fns.items():
            rc: list = []
            us = timer.device_us(lambda fn=fn, rc=rc: rc.append(fn()))
            if launches(name) and rc[0]:
                raise RuntimeError(f"{name}: forge_launch returned {rc[0]}")
            if i >= 3:
                times[name].append(us)
    torch.cuda.synchronize()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    q = {k: (sorted(v)[len(v) // 4], sorted(v)[(3 * len(v)) // 4]) for k, v in times.items()}
    return med, q


def device_times_us(ws, card, loaded, reps: int = 30) -> dict:
    """Device time (CUDA events around one call, L2 flushed before each and the device held busy
    while the host enqueues it: median µs) of the node's kernel, loaded into this process (it
    passed the evaluator: correct on every input set), of eager's ops for the card, of
    torch.compile's code for them, and of a torch copy of the card's bytes, interleaved, on the
    same inputs. What the 85% target asks, measured without a host in it: the evaluator's protocol
    times a candidate through another process (a round trip and a GPU context switch a sample,
    spread over its calls) and the copy in the judge's own, so the ratio of those two charges a
    large card's kernel what the copy is not charged. And what torch.compile's kernels do where a
    compiled model calls them, one graph's launches among many: there a call costs no guard, so
    the comparison with ours that matters is the device's. ``loaded``: ``load_node``'s answer
    for the node on cuda."""
    import torch

    from forge_tui.program import bind_program, compile_source, first_compiled_call
    from forge_tui.timing import Timer

    call, ins, _ = loaded
    n = max(16, card.bytes // 2 // 16 * 16)
    src_b = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst_b = torch.empty_like(src_b)
    timer = Timer("cuda", cold_l2=True)
    fns = {"ours": call, "copy": lambda: dst_b.copy_(src_b), "eager": bind_program(card.program, ins, "cuda")}
    compile_error = None
    try:
        compiled = torch.compile(compile_source(card.program, len(ins)), dynamic=False)
        compile_error = first_compiled_call(compiled, *ins, device="cuda")  # compiled now, not timed
        if compile_error is None:
            fns["compile"] = lambda: compiled(*ins, device="cuda")
    except Exception as exc:  # noqa: BLE001 - the other times still stand
        compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    torch.cuda.synchronize()
    med, q = interleaved_device_us(fns, reps, lambda name: name == "ours", timer)
    out = {"ours_device_us": med["ours"], "copy_device_us": med["copy"], "eager_device_us": med["eager"],
           "compile_device_us": med.get("compile"), "compile_error": compile_error,
           "quartiles_us": q, "outputs_match_eager": outputs_match(card, ws, loaded),
           "pct_copy_device": 100.0 * med["copy"] / med["ours"] if med["ours"] > 0 else None}
    if med.get("compile") and med["ours"] > 0:
        out["speedup_vs_compile_device"] = med["compile"] / med["ours"]
        out["compile_pct_copy_device"] = 100.0 * med["copy"] / med["compile"]
    return out


def case_name(source: str, card, taken: set[str]) -> str:
    first = next((s for s in card.inputs if s.role == "input"), card.inputs[0] if card.inputs else None)
    shape = "x".join(str(d) for d in first.shape) if first is not None and first.shape else "scalar"
    name = f"{source}/{card.op_name}/{SHORT_DTYPE.get(card.dtype, card.dtype)}/{shape}"
    if name in taken:
        name += f"/{card.id[-6:]}"
    taken.add(name)
    return name


def wanted(name: str, patterns: list[str] | None) -> bool:
    return not patterns or any(p in name for p in patterns)


def source_wanted(source: str, patterns: list[str] | None) -> bool:
    """Whether a source can hold a case the patterns keep (a pattern's part before '/' names it)."""
    if not patterns:
        return True
    return any("/" not in p or p.split("/", 1)[0] in source for p in patterns)


def node_rows(ws, card_id: str) -> list[dict]:
    """Every evaluation of the card, in order, from the search's git store (typed results)."""
    from forge_tui.evaluator.result import load_result
    from forge_tui.search.store import SearchStore

    rows = []
    with ws.git() as repo:
        store = SearchStore(repo)
        for r in sorted((r for r in store.load().nodes if r.card == card_id and r.node != "root"),
                        key=lambda r: r.seq):
            res = load_result(store.read(r.commit, "result.json"))
            t = res.timing if res is not None else None
            sve, svc = (t.speedup_vs_eager if t else None), (t.speedup_vs_compile if t else None)
            rows.append({
                "node": r.node, "seq": r.seq, "commit": r.commit, "status": r.status, "move": r.move, "reason": r.reason[:300],
                "correct": bool(res is not None and res.correct),
                "speedup_vs_eager": res.speedup_vs_eager if res else None,
                "speedup_vs_compile": res.speedup_vs_compile if res else None,
                "time_us": res.time_us if res else None,
                "eager_us": t.eager.median if t else None,
                "compile_us": t.compile.median if t and t.compile else None,
                "compile_note": t.compile_note if t else None,
                "sp_q1": sve.q1 if sve else None, "sp_q3": sve.q3 if sve else None,
                "spc_q1": svc.q1 if svc else None, "spc_q3": svc.q3 if svc else None,
                "floor_us": t.floor_us if t else None, "fraction_of_floor": t.fraction_of_floor if t else None,
                "noise": t.noise if t else None,
                "resolution_us": t.resolution_us if t else None,
            })
    return rows



def main(argv: list[str] | None = None) -> int:
    from forge_tui.codegen_targets import copy_as_candidate_us, pct_copy, targets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="CPU-sized sources and cases, few evaluations")
    ap.add_argument("--sources", nargs="*", help="sources to profile (default: all of the mode's)")
    ap.add_argument("--cases", nargs="*", help="run the cases whose name contains one of these")
    ap.add_argument("--evals", type=int, help="evaluations a card at most (default 20; 3 with --small)")
    ap.add_argument("--case-wall", type=float, help="wall-clock limit of one case's search, s (default 60; 20 small)")
    ap.add_argument("--min-case-wall", type=float, default=15.0, help="skip a case with less time than this left, s")
    ap.add_argument("--budget-s", type=float, help="the whole run, profiles included, s (default 540; 100 small)")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="evaluator limit per phase (s)")
    ap.add_argument("--parallel", type=int, help="evaluations in flight (default 3 on cuda, 1 on cpu)")
    ap.add_argument("--threads", type=int, help="CPU threads of eager and our kernels on the cpu (default 1 with "
                    "--small: steadier on a small shared machine; 0: every core)")
    ap.add_argument("--op-cards", action="store_true",
                    help="also op cards made outside every module card whose program the generator expresses "
                         "(ResNet's batch norms make no module card); profiles every op (slower)")
    ap.add_argument("--list", action="store_true", help="profile the sources and list the cases; search nothing")
    ap.add_argument("--large-mib", type=float, default=64.0,
                    help="a card moving at least this many MiB is a large shape (the 85%% of copy target)")
    args = ap.parse_args(argv)
    small = args.small
    evals = args.evals or (3 if small else 20)
    case_wall = args.case_wall or (20.0 if small else 60.0)
    budget = args.budget_s or (100.0 if small else 540.0)
    parallel = args.parallel or (3 if args.device == "cuda" else 1)
    patterns = args.cases or (SMALL_CASES if small and not args.sources else None)
    t_start = time.time()
    deadline = t_start + budget

    import faulthandler

    import torch

    faulthandler.dump_traceback_later(budget + 30, repeat=True)  # a run stuck past its budget shows where

    from forge_tui.cards import CardKind
    from forge_tui.codegen import kernel_or_reason
    from forge_tui.config import parse_config
    from forge_tui.search.events import EventBus, NodeAdded
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.templates.proposer import TemplateProposer
    from forge_tui.templates.registry import match
    from forge_tui.workspace import profile_into_workspace

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    def family_of(card) -> str | None:
        """The family that serves the card: a hand-written one where it matches, else generated."""
        _, m = match(card)
        return m.family if m else None

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu (and --small on a CPU machine)", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    out_file = out / ("codegen.json" if args.device == "cuda" else "codegen_cpu.json")
    tmp = Path(tempfile.mkdtemp(prefix="forge-codegen-"))
    os.environ.setdefault("FORGE_CACHE_DIR", str(tmp / "cache"))
    cfg_path = tmp / "forge.toml"
    warmup, repeats = (2, 10) if args.device == "cpu" else (3, 10)
    threads = args.threads if args.threads is not None else (1 if small else 0)
    cfg_path.write_text(CONFIG.format(ops="true" if args.op_cards else "false",
                                      warmup=1 if small else warmup, repeats=5 if small else repeats, threads=threads,
                                      max_sample_mib=64.0 if small else 1200.0))
    report: dict = {
        "date": time.strftime("%Y-%m-%d"), "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {os.cpu_count()} cores",
        "torch": torch.__version__, "command": "python bench/codegen_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {"evals": evals, "case_wall": case_wall, "budget_s": budget, "parallel": parallel,
                     "small": small, "cases": patterns, "large_mib": args.large_mib,
                     "threads": threads if args.device == "cpu" else None},
        "sources": {}, "not_served": {}, "cases": {}, "skipped": {},
    }

    def save() -> None:
        out_file.write_text(json.dumps(report, indent=1, default=str))

    # ---- collect: profile each source (module cards only) and keep the generator's cards ------
    sources = args.sources or (SMALL_SOURCES if small else GPU_SOURCES)
    transformers_ok = transformers_available()
    planned: dict[str, list[tuple[str, object, object]]] = {}  # source -> [(case, ws, card)]
    for source in sources:
        if not source_wanted(source, patterns):
            continue
        if time.time() > deadline - args.min_case_wall:
            report["sources"][source] = {"skipped": "the budget is spent"}
            log(f"{source}: not profiled, the budget is spent")
            continue
        if source == "transformers":
            if not transformers_ok:
                report["sources"][source] = {"skipped": "transformers is not importable here"}
                log("transformers: not importable here, skipped")
                continue
            spec = tmp / "transformers_leaves.py"
            b, s = (2, 16) if small else (4, 1024)
            spec.write_text(TRANSFORMERS_WORKLOAD.format(B=b, S=s, small=small))
        elif source == "modules":
            spec = MODULES_WORKLOAD
        elif source == "modules_wide":
            spec = tmp / "modules_wide.py"
            spec.write_text(WIDE_WORKLOAD.format(path=str(MODULES_WORKLOAD)))
        else:
            spec = f"example:{source}"
        t0 = time.time()
        log(f"{source}: profiling" + ("" if args.op_cards else " (module cards only)"))
        try:
            ws, _ = profile_into_workspace(
                spec, tmp / f"ws_{source}", device=args.device, config_path=cfg_path,
                progress=lambda m, source=source: log(f"  [{source}] {m}") if "card" not in m else None)
        except Exception as exc:  # noqa: BLE001 - one broken source must not lose the others
            report["sources"][source] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"{source}: profile failed: {type(exc).__name__}: {exc}")
            save()
            continue
        served, refused = [], {}
        op_refused = 0
        for card in ws.cards():
            if card.kind != CardKind.MODULE and not (args.op_cards and not card.within):
                continue
            k = kernel_or_reason(card)
            if not isinstance(k, str):
                served.append(card)
            elif card.kind == CardKind.MODULE:
                refused[f"{card.op_name} {card.shapes()} ({card.id})"] = k
            else:
                op_refused += 1
        # the generated family's cards first (the hand-written families' were measured by
        # templates_bench.py), then by time in the forward
        served.sort(key=lambda c: (family_of(c) != "generated", -(c.total_us or 0.0)))
        taken: set[str] = set()
        planned[source] = [(case_name(source, c, taken), ws, c) for c in served]
        report["sources"][source] = {"profile_wall_s": time.time() - t0, "op_cards_refused": op_refused,
                                     "served": [n for n, _, _ in planned[source]]}
        report["not_served"][source] = refused
        log(f"{source}: {len(served)} cards the generator expresses, {len(refused)} module cards it does not"
            + (f", {op_refused} op cards it does not" if args.op_cards else "") + f" ({time.time() - t0:.1f}s)")
        for what, why in refused.items():
            log(f"  not served: {what}: {why[:200]}")
        save()
        if args.device == "cuda":
            torch.cuda.empty_cache()

    # ---- the cases, in turns over the sources (each source's biggest card first) ---------------
    queues = {s: [x for x in items if wanted(x[0], patterns)] for s, items in planned.items()}
    order = []
    while any(queues.values()):
        for s in list(queues):
            if queues[s]:
                order.append(queues[s].pop(0))
    log(f"{len(order)} cases: " + ", ".join(n for n, _, _ in order))
    if args.list:
        for name, _, card in order:
            print(f"{name:50s} {family_of(card) or '-':12s} {card.id:32s} {card.shapes()[:60]:60s} "
                  f"eager {card.time_us or 0:9.1f} µs x{card.calls}")
        return 0
    pools: dict[int, LocalEvalPool] = {}
    base = {"timing": {"warmup": warmup, "repeats": repeats, "threads": threads},
            "evaluator": {"run_timeout_s": args.run_timeout, "random_sets": 3}}
    pool_cfg = parse_config(base)
    try:
        for name, ws, card in order:
            left = deadline - time.time()
            wall = min(case_wall, left - min(END_MARGIN_S, budget / 10))
            if wall < args.min_case_wall:
                report["skipped"][name] = f"budget: {left:.0f} s of {budget:.0f} s left"
                log(f"{name}: skipped, {left:.0f} s of the {budget:.0f} s budget left (needs {args.min_case_wall:.0f})")
                save()
                continue
            case: dict = {"card": card.id, "family": family_of(card), "dtype": card.dtype,
                          "shapes": card.shapes(), "bytes": card.bytes, "eager_profile_us": card.time_us,
                          "floor_us": card.floor_us, "share": card.share, "wall_limit_s": wall}
            t0 = time.time()
            try:
                case["copy_us"] = same_size_copy_us(card.bytes, args.device, threads)
                if args.device == "cuda" and card.bytes >= args.large_mib * (1 << 20):
                    try:
                        case["copy_candidate_us"] = copy_as_candidate_us(card.bytes, card.dtype, tmp, cfg_path, pool_cfg)
                        log(f"{name}: the same-size copy timed as a candidate: {case['copy_candidate_us']} µs")
                    except Exception as exc:  # noqa: BLE001 - the reference is extra: the case goes on
                        case["copy_candidate_error"] = f"{type(exc).__name__}: {exc}"
                        log(f"{name}: the copy as a candidate failed: {case['copy_candidate_error'][:300]}")
                log(f"{name}: searching {card.id} with {case['family']} (eager {card.time_us or 0:.1f} µs in the "
                    f"profile, same-size copy {case['copy_us']:.1f} µs, {wall:.0f} s)")
                cfg = parse_config(dict(base, search={
                    "max_evals": 1_000_000, "evals_per_card": evals, "parallel": parallel, "max_wall_s": wall,
                    "min_gain": 0.0, "floor_fraction": 0.97}))
                pool = pools.get(id(ws))
                if pool is None:
                    pool = pools[id(ws)] = LocalEvalPool(ws.store, ws.cache, pool_cfg, backend=args.device)
                bus = EventBus()

                def on_event(ev, name=name) -> None:
                    if isinstance(ev, NodeAdded) and ev.parent:
                        log(f"  {name} {ev.node}: {ev.status} x{ev.speedup or 0:.2f} eager  {ev.move}  "
                            f"{(ev.reason or '')[:240]}")

                bus.subscribe(on_event)
                # one workspace holds every case of its source: each search resumes its store
                summary = Search(ws, cfg, TemplateProposer(), pool, cards=[card.id], bus=bus).run(resume=True)
                rows = node_rows(ws, card.id)
                ok = [r for r in rows if r["status"] == "passed" and r["speedup_vs_eager"]]
                # the search's best: the fastest by its own time against eager pooled over the card
                chosen = (summary.best.get(card.id) or {}).get("node")
                best = next((r for r in ok if r["node"] == chosen), None) or \
                    min(ok, key=lambda r: r["time_us"] or float("inf"), default=None)  # none beat eager: the fastest
                first = next((i + 1 for i, r in enumerate(rows) if r["correct"]), None)
                case.update(nodes=rows, best=best, evals=len(rows), first_correct=first, stopped=summary.stopped,
                            finished=summary.finished.get(card.id), skipped_why=summary.skipped.get(card.id))
                loaded = None
                if best is not None:
                    # the reported kernel, built again and loaded here, gives eager's outputs
                    loaded = load_node(ws, card, best["commit"], args.device)
                    case["reloaded_matches_eager"] = loaded is not None and loaded[0]() == 0 and \
                        outputs_match(card, ws, loaded)
                if best is not None and loaded is not None and args.device == "cuda":
                    try:
                        case["device_time"] = device_times_us(ws, card, loaded)
                        log(f"{name}: device time (CUDA events, this process): {case['device_time']}")
                    except Exception as exc:  # noqa: BLE001 - the extra measurement must not lose the case
                        case["device_time_error"] = f"{type(exc).__name__}: {exc}"
                        log(f"{name}: device time failed: {case['device_time_error'][:300]}")
            except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
                import traceback

                case["error"] = f"{type(exc).__name__}: {exc}"
                case["traceback"] = traceback.format_exc()[-2000:]
            case["wall_s"] = time.time() - t0
            case["targets"] = targets(case, args.device, evals, int(args.large_mib * (1 << 20)))
            report["cases"][name] = case
            save()
            b = case.get("best")
            log(f"{name}: " + (
                f"best {b['speedup_vs_eager']:.2f}x eager, {b['speedup_vs_compile'] or float('nan'):.2f}x compile, "
                f"{_fmt(pct_copy(case), '.0f')}% of a same-size copy "
                f"({_fmt(pct_copy(case, 'copy_candidate_us'), '.0f')}% of one timed as a candidate), first correct at eval "
                f"{case['first_correct']} of {case['evals']} ({b['move']})" if b else
                f"no passing candidate: {case.get('error') or case.get('skipped_why') or [r['reason'][:160] for r in case.get('nodes', [])][:2]}"))
    finally:
        for pool in pools.values():
            pool.close()
    report["wall_s"] = time.time() - t_start
    save()
    print_table(report)
    return 0


def _fmt(v, spec: str, dash: str = "-") -> str:
    return dash if v is None else format(v, spec)


def print_table(report: dict) -> None:
    from forge_tui.codegen_targets import pct_copy

    def mark(v) -> str:
        return "n/a" if v is None else ("pass" if v else "FAIL")

    cuda = report["device"] == "cuda"
    print(f"\ncode generator bench, {report['device_name']}, torch {report['torch']}, {report['date']}: "
          f"{report['command']}")
    head = (f"{'case':50s} {'family':11s} {'eager µs':>9s} {'compile µs':>10s} {'ours µs':>9s} {'vs eager [q1, q3]':>20s} "
            f"{'vs compile [q1, q3]':>20s} {'%copy':>6s} {'%cand':>6s} {'%dev':>6s} {'dev vs c':>8s} {'1st ok':>6s} "
            f"{'evals':>5s}  targets")
    print(head)
    for name, c in report["cases"].items():
        b, t = c.get("best"), c.get("targets", {})
        tg = f"correct {mark(t.get('correct'))}, " + (
            f"85% copy {mark(t.get('copy_85'))}, vs compile {mark(t.get('vs_compile'))}" if cuda else
            f"beats eager {mark(t.get('beats_eager'))}")
        if not b:
            why = c.get("error") or c.get("skipped_why") or "no passing candidate"
            print(f"{name:50s} {str(c.get('family')):11s} {'-':>9s} {'-':>10s} {'-':>9s}  {why[:70]}  "
                  f"(1st ok {_fmt(c.get('first_correct'), 'd')}, {c.get('evals', 0)} evals; {tg})")
            continue
        # a time under the timer's resolution (tiny cards on the cpu) is shown as such: its ratio
        # then measures eager's dispatch overhead more than our kernel
        res = b.get("resolution_us") or 0.0
        ours = f"{b['time_us']:9.1f}" if b["time_us"] > res else f"<{res:.1f}"
        pct = "-" if pct_copy(c) is None or b["time_us"] <= res else f"{pct_copy(c):5.0f}%"
        pcand = "-" if pct_copy(c, "copy_candidate_us") is None else f"{pct_copy(c, 'copy_candidate_us'):5.0f}%"
        dev = (c.get("device_time") or {}).get("pct_copy_device")
        pdev = "-" if dev is None else f"{dev:5.0f}%"
        dvc = (c.get("device_time") or {}).get("speedup_vs_compile_device")
        pdvc = "-" if dvc is None else f"{dvc:.2f}x"
        sp = f"{b['speedup_vs_eager']:.2f}x [{_fmt(b['sp_q1'], '.2f')}, {_fmt(b['sp_q3'], '.2f')}]"
        spc = (f"{b['speedup_vs_compile']:.2f}x [{_fmt(b['spc_q1'], '.2f')}, {_fmt(b['spc_q3'], '.2f')}]"
               if b.get("speedup_vs_compile") else "-")
        fam = (b.get("move") or "").split(":")[0] or c["family"]  # the best kernel's family (the generator competes)
        print(f"{name:50s} {str(fam):11s} {_fmt(b['eager_us'], '9.1f'):>9s} {_fmt(b['compile_us'], '10.1f'):>10s} "
              f"{ours:>9s} {sp:>20s} {spc:>20s} {pct:>6s} {pcand:>6s} {pdev:>6s} {pdvc:>8s} "
              f"{_fmt(c['first_correct'], '6d'):>6s} {c['evals']:5d}  {tg}")
    for name, why in report["skipped"].items():
        print(f"{name:50s} skipped: {why}")
    for source, info in report["sources"].items():
        if "served" not in info:
            print(f"source {source}: {info.get('skipped') or info.get('error')}")


if __name__ == "__main__":
    sys.exit(main())
