"""The code generator (forge_tui/codegen): a table of leaf modules written as models write them,
captured to module cards, whose generated kernels pass the real evaluator on the cpu backend
against eager; refusals that say why; a property test of random pointwise/reduction programs
(the analysis checked through its torch interpreter), a batch of random programs compiled once
and run; the index algebra; CUDA sources compiled with nvcc; op cards nested in module cards."""

import ctypes
import dataclasses
import os
import random
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from forge_tui.cards import Card
from forge_tui.codegen import Generated, Unsupported, analyze, explain
from forge_tui.codegen.emit_common import math_modes
from forge_tui.codegen.emit_cpu import PRELUDE, emit_cpu
from forge_tui.codegen.index import Space, evaluate
from forge_tui.codegen.interp import interpret
from forge_tui.compare import compare
from forge_tui.config import ForgeConfig, parse_config
from forge_tui.evaluator import EvalOptions, Evaluator
from forge_tui.evaluator.build import Builder
from forge_tui.kernel_abi import ForgeScalar, ForgeTensor, alloc_outputs, describe
from forge_tui.kernels.device import H200
from forge_tui.profiler.capture import CARD_ATTR, CaptureOptions, Recorder
from forge_tui.program import run_program
from forge_tui.templates.proposer import TemplateProposer
from forge_tui.templates.registry import match
from forge_tui.tensorstore import unpack
from forge_tui.workspace import profile_into_workspace

HERE = Path(__file__).parent
WORKLOADS = HERE / "data" / "workloads"
CFG = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0},
                    "evaluator": {"run_timeout_s": 30.0}})
GEN = Generated()
FEW_SMS = dataclasses.replace(H200, sms=2)
"""A GPU the tiny table's cards fill: enough blocks for every SM with several rows a thread."""
# every leaf module of codegen_modules.py that makes a module card (dtype variants count once)
MODULES = {"GemmaRMSNorm", "HFRMSNorm", "QKNorm", "T5LayerNorm", "FP32LayerNorm", "Rotary", "GQARotary", "PartialRotary",
           "SoftCap",
           "SiluGate", "GeluGate", "ChunkSwiGLU", "ChunkGeGLU", "RouterMask", "MaskedScale", "HandGroupNorm",
           "ContiguousGroupNorm",
           "GroupNormSiLU", "MaskedSoftmax", "LogSumExp", "L2Normalize", "Standardize", "AbsMaxQuant", "MinMaxScale",
           "DyT", "AddRMSNorm", "SqueezeExciteRow", "TransposedMul", "HalfCastChain", "VarMean", "RopeFrequencies"}


def _name(card: Card) -> str:
    return card.op_name


@pytest.fixture(scope="module")
def table_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("codegen")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n[profile]\nops = false\n")
    ws, _ = profile_into_workspace(WORKLOADS / "codegen_modules.py", root / "ws", device="cpu", config_path=cfg)
    return ws


@pytest.fixture(scope="module")
def evaluated(table_ws):
    """Every module card's generated kernel (its first configuration) through the evaluator; the
    builds first, two at a time."""
    cards = [c for c in table_ws.cards() if c.kind == "module"]
    sources = {}
    for card in cards:
        m = GEN.match(card)
        assert m is not None, (card.id, explain(card))
        sources[card.id] = GEN.render(m, GEN.initial(m, "cpu"), "cpu")
    out = {}
    with Evaluator(table_ws.store, table_ws.cache, CFG, backend="cpu") as ev:
        with ThreadPoolExecutor(2) as pool:
            builds = list(pool.map(ev.build, sources.values()))
        assert all(b.ok for b in builds), [b.log[:2000] for b in builds if not b.ok]
        for card in cards:
            out[card.id] = (card, ev.evaluate(card, sources[card.id], EvalOptions(timing=False)))
    return out


def test_the_table_covers_the_modules_the_issue_names(evaluated):
    names = {_name(c) for c, _ in evaluated.values()}
    assert MODULES <= names, MODULES - names
    assert len(evaluated) >= 30  # bf16 variants of the Gemma and T5 norms are cards of their own


def test_every_module_passes_the_evaluator_against_eager(evaluated):
    failed = {card.id: f"{r.status}: {r.reason}" for card, r in evaluated.values() if r.status != "passed"}
    assert not failed, failed
    for card, r in evaluated.values():
        sets = {s.name for s in r.correctness.sets}
        assert "adversarial-special" in sets and any(s.startswith("random") for s in sets), (card.id, sets)
        if _name(card) in ("GemmaRMSNorm", "HandGroupNorm", "Standardize", "FP32LayerNorm"):
            assert {"adversarial-zeros", "adversarial-tiny", "adversarial-offset"} <= sets, (card.id, sets)


def test_the_analysis_picks_the_rows_the_program_reduces(table_ws):
    kern = {}
    for card in table_ws.cards():
        kern.setdefault(_name(card), analyze(card))
    gemma, gn, rot, soft = kern["GemmaRMSNorm"], kern["HandGroupNorm"], kern["Rotary"], kern["MaskedSoftmax"]
    assert (gemma.rows, gemma.cols, [r.kind for r in gemma.reductions]) == (16, 64, ["sum"])
    assert (gn.rows, gn.cols, gn.levels) == (2 * 4, 2 * 4 * 4, 2)  # groups of 2 channels x 4 x 4, two phases
    assert (rot.rows, rot.cols, rot.reductions) == (2 * 4 * 8, 16, [])  # a row a head and position
    assert [r.kind for r in soft.reductions] == ["amax", "sum"] and soft.levels == 2
    assert kern["QKNorm"].cols == 16 and kern["ChunkSwiGLU"].cols == 32
    assert [o.per_row for o in kern["AbsMaxQuant"].outputs] == [False, True]
    assert kern["SoftCap"].rows == 1  # pointwise, nothing broadcasts: one flat row


def test_hand_written_families_keep_priority(table_ws):
    fams = {}
    for card in table_ws.cards():
        fam, m = match(card)
        fams.setdefault(_name(card), set()).add(m.family if m else None)
    assert fams["HFRMSNorm"] == {"rms_norm"} and fams["SiluGate"] == {"elementwise"}
    assert fams["GemmaRMSNorm"] == {"generated"} and fams["ChunkSwiGLU"] == {"generated"}
    assert fams["Rotary"] == {"generated"} and fams["HandGroupNorm"] == {"generated"}


def test_moves_are_one_axis_and_every_backend_has_points(table_ws):
    card = next(c for c in table_ws.cards() if _name(c) == "GemmaRMSNorm" and c.dtype == "bfloat16")
    prop = TemplateProposer()
    m = GEN.match(card)
    for backend in ("cuda", "cpu"):
        first = GEN.initial(m, backend)
        assert GEN.valid(m, first, backend)
        nbrs = prop.neighbours(GEN, m, first, backend)
        assert nbrs
        for q in nbrs:
            assert sum(q[k] != first[k] for k in first) == 1, (first, q)
    axes = GEN.axes(m, "cuda")
    assert {"tpr", "rpb", "vec", "cache", "grid"} <= set(axes) and "smem" in axes["cache"]
    assert GEN.initial(m, "cuda")["vec"] == 8  # 16-byte accesses of bf16


def _groups(src: str) -> int:
    """A rows kernel's GROUPS, worked out from its source's C (rows rounded up to whole groups)."""
    import re

    m = re.search(r"static const int64_t ROWS = (\d+);\nstatic const int64_t GROUPS = \(ROWS \+ (\d+)\) / (\d+);", src)
    assert m is not None, src[-3000:]
    return (int(m.group(1)) + int(m.group(2))) // int(m.group(3))


def _blocks(expr: str) -> int:
    """A flat kernel's block count, ``(unsigned)((N LL + k - 1) / k)``, worked out."""
    import re

    m = re.fullmatch(r"\(unsigned\)\(\((\d+)LL \+ (\d+)\) / (\d+)\)", expr)
    assert m is not None, expr
    return (int(m.group(1)) + int(m.group(2))) // int(m.group(3))


def test_waves_is_valid_exactly_when_the_emitter_launches_fewer_blocks_than_rows():
    """The "waves" grid launches min(groups, SMs x resident blocks), resident blocks capped at 32:
    valid() counts them the same way, so a waves grid the emitter would launch differently from
    "rows" is not refused (with 32 threads a block, 2048 a SM would hold 64 without the cap)."""
    import dataclasses
    import re

    from forge_tui.kernels.device import H200

    card = card_of(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), torch.randn(4096, 64))
    m = GEN.match(card)
    assert GEN._k(m).rows == 4096
    p = {**GEN.initial(m, "cuda"), "tpr": 4, "rpb": 8, "vec": 4, "cache": "none", "grid": "waves"}  # 512 groups
    for sms, launches_fewer in ((10, True), (16, False)):  # 320 blocks at once; 512, all of them
        dev = dataclasses.replace(H200, sms=sms)
        src = GEN.render(m, p, "cuda", dev) if GEN.valid(m, p, "cuda", dev) else None
        assert (src is not None) == launches_fewer, sms
        if src is not None:
            cap = re.search(r"<<<\(unsigned\)\(GROUPS < (\d+) \? GROUPS : (\d+)\)", src)
            assert cap is not None and int(cap.group(1)) == int(cap.group(2)) == sms * 32 < 512 == _groups(src), sms


def test_rows_a_thread_load_every_row_before_any_reduction(table_ws):
    """``rpt``: each thread handles ``rpt`` rows, ``rpb`` apart; every row's loads come before the
    first row's reduction (more bytes in flight a thread, the way torch.compile's kernel for a
    128-column per-head norm does it), each row with its own names, and the grid has a block for
    each ``rpb * rpt`` rows; where every group is whole, no row is clamped. Refused with a row split over a cluster, with shared memory, and where
    the grid would have fewer blocks than the GPU has SMs."""

    few = FEW_SMS
    by = {(_name(c), c.dtype): c for c in table_ws.cards()}
    gemma = GEN.match(by[("GemmaRMSNorm", "bfloat16")])  # 16 rows of 64
    first = GEN.initial(gemma, "cuda", few)
    assert first["rpt"] == 1 and "rpt" in GEN.axes(gemma, "cuda", few)
    p = {**first, "tpr": 16, "rpb": 2, "rpt": 4}
    assert GEN.valid(gemma, p, "cuda", few)
    src = GEN.render(gemma, p, "cuda", few).split("fg_kernel(", 1)[1]
    before, after = src.split("fg_row_reduce<TPR, 0>(acc0_0", 1)
    assert all(f"p0 + ro0_{i} + c0" in before for i in range(4)) and "_4" not in src
    assert [f"const int64_t rr_{i} = (g * RPT + {i}) * RPB + slot;" in before for i in range(4)] == [True] * 4
    assert all(f"store_vec<__nv_bfloat16, VEC>(q0 + ro0_{i} + c0, o0_{i});" in after for i in range(4))
    assert _groups(GEN.render(gemma, p, "cuda", few)) == 2  # 16 rows, 8 a block
    plain = GEN.render(gemma, {**p, "rpt": 1}, "cuda", few)
    assert "const int64_t rr = g * RPB + slot;" in plain and _groups(plain) == 8
    # every group whole (16 rows, 8 a block): no row's liveness or clamp; one row a thread, or a
    # last group with dead rows (16 rows, 32 a block), keep them
    assert "const int64_t r_3 = rr_3;" in src and "ROWS - 1" not in src
    assert "const int64_t r = live ? rr : ROWS - 1;" in plain
    ragged = GEN.render(gemma, {**p, "rpb": 8}, "cuda", few)
    assert "const int64_t r_3 = live_3 ? rr_3 : ROWS - 1;" in ragged and _groups(ragged) == 1
    assert not GEN.valid(gemma, {**p, "cache": "smem"}, "cuda", few)
    assert not GEN.valid(gemma, {**p, "rpt": 8}, "cuda", few)  # one block for two SMs
    assert not GEN.valid(gemma, p, "cuda", dataclasses.replace(few, sms=4))  # two blocks for four SMs


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_rows_kernels_of_each_kind_build_with_two_rows_a_thread(table_ws):
    """The default suite's share of the test below: rows kernels of three kinds of body, spread
    over the table's module names whose kernel reduces rows."""
    _rows_kernels_build_with_two_rows_a_thread(table_ws, every=False)


@pytest.mark.exhaustive
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.timeout(1200)
def test_every_rows_kernel_of_the_table_builds_with_two_rows_a_thread(table_ws):
    """Each row's copy of the body declares its names in one scope: a name left unsuffixed is
    declared twice, one suffixed in a use but not where it is declared is undeclared, and nvcc
    refuses either. Every module card of the table whose kernel reduces rows, at two rows a
    thread (softmax's two levels, per-row outputs, several outputs, group norms)."""
    _rows_kernels_build_with_two_rows_a_thread(table_ws, every=True)


def _rows_kernels_build_with_two_rows_a_thread(table_ws, every: bool) -> None:
    few = dataclasses.replace(H200, sms=1)
    jobs = []
    for card in table_ws.cards():
        m = GEN.match(card) if card.kind == "module" else None
        first = GEN.initial(m, "cuda", few) if m is not None else {}
        if "rpt" in first:
            p = {**first, "rpt": 2}
            assert GEN.valid(GEN.match(card), p, "cuda", few), (card.id, p)
            jobs.append(GEN.render(m, p, "cuda", few))
    assert len(jobs) >= 18 and all(", 2 rows a thread */" in j for j in jobs)
    if not every:  # spread over the table: its cards come grouped by module name
        jobs = jobs[::-(-len(jobs) // 3)]
    builder = Builder("cuda", Path(tempfile.mkdtemp(dir=table_ws.cache)), arch="sm_90")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(builder.build, jobs))
    bad = [r.log[:2000] for r in results if not r.ok]
    assert not bad, bad[0]


# ---- refusals ------------------------------------------------------------------------------------
def captured(fn, *inputs) -> tuple[Card, list]:
    """The module card of ``fn`` as a leaf module (a card even for one op), and its captured
    inputs (constants the forward made included)."""

    class Leaf(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf = Leaf()
            setattr(self.leaf, CARD_ATTR, True)

        def forward(self, *xs):
            return self.leaf(*xs)

    model = Outer()
    rec = Recorder(model, CaptureOptions(ForgeConfig().profile))
    with torch.no_grad():
        rec.run(lambda: model(*inputs))
    b = next((b for b in rec.buckets.values() if b.kind == "module"), None)
    if b is None:
        raise LookupError("the module computes nothing (no aten call that is not a view)")
    card = Card(id="c", kind="module", target=b.target, label="", inputs=b.inputs, outputs=b.outputs, program=b.program)
    return card, [unpack(*p) for p in b.samples[0][0]]


def card_of(fn, *inputs) -> Card:
    return captured(fn, *inputs)[0]


X = torch.randn(4, 8, 16)


@pytest.mark.parametrize("fn, inputs, why", [
    (lambda x, w: x @ w, (X, torch.randn(16, 4)), "mm over an inner dimension of 16 (a matrix product"),
    (lambda x: torch.searchsorted(x.sort(-1).values, x) * 2, (X,), "not a pointwise op, view or reduction"),
    (lambda x: x.mean(1) * 2, (X,), "not its last dims"),
    (lambda x: x - x.sum(-1, keepdim=True).transpose(0, 1), (torch.randn(4, 4, 4),), "another row"),
    (lambda x: torch.topk(x, 2, -1).values * 2, (X,), "topk"),
    (lambda x: (x * 10).long() + 1, (X,), "floating point to an integer"),
    (lambda x: x.mean(-1, keepdim=True) + x.view(4, 8, 4, 4).mean(-1).sum(-1, keepdim=True), (X,), "reduces 128 rows of 4 where"),
    (lambda x: torch.div(x, 3, rounding_mode="floor") + 1, (X,), "rounding_mode"),
    (lambda x: x.double() * 2, (X,), "float64"),
    (lambda x: torch.cumsum(x, -1) * 2, (X,), "cumsum"),
])
def test_refusals_say_why_in_one_line(fn, inputs, why):
    card = card_of(fn, *inputs)
    reason = explain(card)
    assert reason is not None and why in reason and "\n" not in reason, reason
    assert why in TemplateProposer().supports(card, "cpu")  # the search reports it too


# ---- the index algebra ---------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_index_algebra_agrees_with_arithmetic(shape, data):
    """A row-major position delinearised into a shape, permuted, reshaped and linearised again is
    computed exactly; mixed-radix pieces fold back (a contiguous view is cols * r + c again)."""
    n = 1
    for s in shape:
        n *= s
    k = data.draw(st.integers(0, len(shape)))
    cols = 1
    for s in shape[k:]:
        cols *= s
    sp = Space({"r": n // cols, "c": cols})
    flat = sp.add(sp.scale(sp.var("r"), cols), sp.var("c"))
    idx = sp.delinearize(flat, shape)
    assert sp.linearize(idx, shape) == flat
    rr = torch.arange(n // cols).view(-1, 1)
    cc = torch.arange(cols).view(1, -1)
    ref = torch.arange(n).view(n // cols, cols)
    perm = data.draw(st.permutations(list(range(len(shape)))))
    t = ref.view(*shape).permute(*perm).contiguous()
    # the element of the permuted tensor at permuted index: the original flat position
    pidx = [idx[p] for p in perm]
    pos = evaluate(sp.linearize(pidx, [shape[p] for p in perm]), {"r": rr, "c": cc})
    assert torch.equal(t.reshape(-1)[torch.as_tensor(pos).expand(n // cols, cols)], ref)
    # a reshape and back: always the same positions; folded back to the plain form where the
    # reshape merges dimensions (what views of contiguous rows do)
    new = data.draw(st.sampled_from([[n], [1, n], shape[::-1]]))
    back = sp.linearize(sp.delinearize(sp.linearize(idx, shape), new), new)
    assert torch.equal(torch.as_tensor(evaluate(back, {"r": rr, "c": cc})).expand(n // cols, cols), ref)
    if new != shape[::-1] or len(shape) == 1:
        assert back == flat


# ---- random programs -----------------------------------------------------------------------------
UNARY = ["neg", "abs", "exp", "tanh", "sigmoid", "silu", "relu", "gelu", "sqrt_abs", "rsqrt_sq", "log1p_abs", "sin"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
REDUCE = ["sum", "mean", "amax", "amin", "var", "std", "softmax", "logsumexp"]


def _unary(name: str, x):
    if name == "sqrt_abs":
        return x.abs().sqrt()
    if name == "rsqrt_sq":
        return torch.rsqrt(x * x + 1.0)
    if name == "log1p_abs":
        return torch.log1p(x.abs())
    if name in ("gelu", "silu"):
        return getattr(F, name)(x)
    return getattr(torch, name)(x)


def _reduce(name: str, x, nred: int):
    dims = list(range(-nred, 0))
    if name == "softmax":
        return torch.softmax(x, -1) if nred == 1 else x.amax(dims, keepdim=True)
    if name == "logsumexp":
        return torch.logsumexp(x, dims, keepdim=True)
    if name in ("var", "std"):
        return getattr(torch, name)(x, dims, keepdim=True)
    return getattr(torch, name)(x, dims, keepdim=True)


class Draw:
    """Choices from hypothesis (``data``) or from a seeded Random."""

    def __init__(self, data=None, rng: random.Random | None = None) -> None:
        self.data, self.rng = data, rng

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi)) if self.data is not None else self.rng.randint(lo, hi)

    def pick(self, seq):
        return self.data.draw(st.sampled_from(seq)) if self.data is not None else self.rng.choice(seq)


def random_program(d: Draw):
    """(function, inputs): a few inputs (some broadcast), 1 to 6 steps of pointwise ops, casts,
    rotate-half, reductions over the last one or two dims (one width a program) feeding pointwise
    ops, one or two outputs."""
    nd = d.int(1, 3)
    shape = [d.int(1, 3) for _ in range(nd - 1)] + [d.pick([1, 2, 3, 4, 6, 8, 16])]
    dtype = d.pick([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    nred = 1 if nd == 1 else d.int(1, 2)
    n_in = d.int(1, 3)
    in_shapes = [shape] + [[1 if d.int(0, 2) == 0 else s for s in shape][d.int(0, nd - 1):] for _ in range(n_in - 1)]
    steps = []
    for _ in range(d.int(1, 6)):
        kind = d.pick(["unary", "binary", "binary", "scalar", "reduce", "cast", "where", "rotate"])
        steps.append((kind, d.pick(UNARY), d.pick(BINARY), d.pick(REDUCE), d.int(0, 99), d.int(0, 99),
                      d.pick([0.5, -2.0, 3.0, 1e-3])))
    two_outputs = d.int(0, 1) == 1
    row_shape = shape[:nd - nred] + [1] * nred

    def fn(*xs):
        vals = [x.float() if dtype == torch.float32 else x for x in xs]
        rows = set()  # values that are a reduction's result, one a row

        def shaped(k):
            v = vals[k]
            if list(v.shape) == shape or (k in rows and list(v.shape) == row_shape):
                return v
            return v + torch.zeros(shape, dtype=v.dtype)

        for kind, un, bi, red, a, b, scal in steps:
            x, y = vals[a % len(vals)], vals[b % len(vals)]
            if kind == "unary":
                v = _unary(un, x)
            elif kind == "binary":
                v = getattr(torch, bi)(x, y)
            elif kind == "scalar":
                v = getattr(torch, bi)(x, torch.tensor(scal, dtype=x.dtype)) if bi in ("maximum", "minimum") else \
                    getattr(torch, bi)(x, scal)
            elif kind == "reduce":
                if list(x.shape) != shape:  # reductions read whole rows of the program's shape (not constant
                    x = x + vals[0]           # rows: eager's variance of one is rounding noise, not 0)
                v = _reduce(red, x, nred) * 1.0
                if list(v.shape) == row_shape:
                    rows.add(len(vals))
            elif kind == "cast":
                v = x.to(torch.float32 if x.dtype != torch.float32 else dtype)
            elif kind == "where":
                v = torch.where(x > y, x, y * 0.5)
            else:
                if x.shape[-1] % 2:
                    v = -x
                else:
                    h = x.shape[-1] // 2
                    v = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
            vals.append(v)
        out = shaped(len(vals) - 1)
        return (out, shaped(len(xs))) if two_outputs and len(vals) > len(xs) + 1 else out

    g = torch.Generator().manual_seed(d.int(0, 1000))
    inputs = [torch.randn(*s, generator=g).to(dtype) for s in in_shapes]
    return fn, inputs


def _scale(e) -> float:
    """The size of the reference's values (their RMS over the finite ones), as the evaluator's, at
    least 1e-3: the inputs are of order 1, so a smaller reference is the noise of a cancellation
    (eager's variance of a constant row is 1e-14, not 0)."""
    if not e.is_floating_point():
        return 1.0
    fin = e[torch.isfinite(e)].double()
    return max(float(fin.pow(2).mean().sqrt()) if fin.numel() else 1.0, 1e-3)


def _check_against_eager(card: Card, got: list, inputs: list, special: bool) -> None:
    expected = run_program(card.program, [t.clone() for t in inputs])
    for k, (g, e) in enumerate(zip(got, expected)):
        bad = compare(g, e, k, nonfinite="position" if special else "exact", scale=_scale(e))
        assert bad is None, f"{bad}\n{card.program}"


def _special(card: Card, inputs: list) -> list:
    """NaN and +inf planted in the first and last elements of every floating input."""
    out = []
    for spec, t in zip(card.inputs, inputs):
        t = t.clone()
        flat = t.view(-1)
        if spec.role == "input" and t.is_floating_point() and flat.numel() >= 3:
            flat[0], flat[-1] = float("nan"), float("inf")
        out.append(t)
    return out


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@settings(max_examples=int(os.environ.get("CG_EXAMPLES", "80")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_programs_match_eager_through_the_interpreter(data):
    fn, inputs = random_program(Draw(data=data))
    try:
        card, inputs = captured(fn, *inputs)
    except LookupError:
        assume(False)
    kern = analyze(card)  # every such program is expressible
    for special in (False, True):
        ins = _special(card, inputs) if special else inputs
        _check_against_eager(card, interpret(kern, card, ins), ins, special)


def _call(fn_ptr, ins: list, outs: list) -> int:
    n_in, n_out = len(ins), len(outs)
    a = (ForgeTensor * max(n_in, 1))(*[describe(t) for t in ins])
    b = (ForgeTensor * max(n_out, 1))(*[describe(t) for t in outs])
    s = (ForgeScalar * 1)()
    return fn_ptr(a, n_in, b, n_out, s, 0, None)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_a_batch_of_random_programs_compiled_once_matches_eager(tmp_path):
    """Twelve random programs' C++ in one translation unit (one compile), each called on fresh
    and special inputs and compared with eager."""
    rng = random.Random(int(__import__("os").environ.get("CG_SEED", "17")))
    progs = []
    while len(progs) < 12:
        fn, inputs = random_program(Draw(rng=rng))
        try:
            card, inputs = captured(fn, *inputs)
        except LookupError:
            continue
        kern = analyze(card)
        params = {"chunk": 1, "simd": len(progs) % 2, **({} if kern.reductions else {"cblock": [0, 4][len(progs) % 2]})}
        src = emit_cpu(kern, params, card)
        assert src.startswith(PRELUDE)
        body = src[len(PRELUDE):].replace("FORGE_EXPORT int forge_launch(", f"FORGE_EXPORT int forge_launch_{len(progs)}(")
        progs.append((card, inputs, f"namespace k{len(progs)} {{\n{body}\n}}\n"))
    built = Builder("cpu", tmp_path).build(PRELUDE + "".join(p[2] for p in progs))
    assert built.ok, built.log[:3000]
    lib = ctypes.CDLL(str(built.library))
    for i, (card, inputs, _) in enumerate(progs):
        fn_ptr = getattr(lib, f"forge_launch_{i}")
        fn_ptr.restype = ctypes.c_int
        for special in (False, True):
            ins = _special(card, inputs) if special else inputs
            outs = alloc_outputs(card.outputs, "cpu")
            assert _call(fn_ptr, ins, outs) == 0
            _check_against_eager(card, outs, ins, special)


def _run_cpu(card: Card, params: dict, inputs: list, tmp_path: Path) -> list:
    built = Builder("cpu", tmp_path).build(emit_cpu(analyze(card), params, card))
    assert built.ok, built.log[:3000]
    fn_ptr = ctypes.CDLL(str(built.library)).forge_launch
    fn_ptr.restype = ctypes.c_int
    outs = alloc_outputs(card.outputs, "cpu")
    assert _call(fn_ptr, inputs, outs) == 0
    return outs


def test_fp32_math_rounds_the_outputs_where_eager_math_rounds_every_op(tmp_path):
    """``math``: ``eager`` is eager bit for bit; ``fp32`` rounds only what is stored, so it differs
    from eager where an op's bf16 rounding mattered, is nearer the float64 result than eager, and
    a later op reads an output as it was stored."""

    def prog(x, y):
        h = x * y + y
        return h, h * h - x

    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(64, 256, generator=g).bfloat16() for _ in range(2))
    card, ins = captured(prog, x, y)
    kern = analyze(card)
    assert math_modes(kern, "cpu") == ["eager", "fp32"] and math_modes(kern, "cuda") == ["eager", "fp32"]
    base = {"chunk": 1, "simd": 1, "cblock": 0}
    exact = _run_cpu(card, {**base, "math": "eager"}, ins, tmp_path / "eager")
    wide = _run_cpu(card, {**base, "math": "fp32"}, ins, tmp_path / "fp32")
    eager = run_program(card.program, [t.clone() for t in ins])
    assert all(torch.equal(a, b) for a, b in zip(exact, eager))
    xd, yd = x.double(), y.double()
    truth = [xd * yd + yd]
    truth.append(truth[0] * truth[0] - xd)
    h = wide[0].float()
    assert (wide[1] == (h * h - x.float()).bfloat16()).float().mean() > 0.99  # from h as stored
    for k in (0, 1):
        assert not torch.equal(wide[k], exact[k])
        err_wide = (wide[k].double() - truth[k]).abs().mean()
        err_eager = (exact[k].double() - truth[k]).abs().mean()
        assert err_wide < err_eager, (k, err_wide, err_eager)


def test_nocast_math_keeps_the_models_own_downcast_in_fp32_as_torch_compile_does(tmp_path):
    """``nocast``: a model that casts an fp32 value to bf16 between ops (Qwen-3's and Llama's
    RMSNorm: ``w * h.to(bf16)``) rounds it in eager and fp32 math, one conversion an element on the
    GPU's quarter-rate pipe; torch.compile keeps it in fp32 (Inductor's default), and so does
    ``nocast``: the kernel has no rounding before the weight's product, differs from eager only
    where that rounding mattered, and is nearer the float64 result than eager."""

    def prog(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(torch.bfloat16)

    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(64, 128, generator=g).bfloat16(), (1 + 0.1 * torch.randn(128, generator=g)).bfloat16()
    card, ins = captured(prog, x, w)
    kern = analyze(card)
    assert math_modes(kern, "cpu") == ["eager", "nocast"] and math_modes(kern, "cuda") == ["eager", "nocast"]
    m = GEN.match(card)
    first = GEN.initial(m, "cuda")
    body = {mode: GEN.render(m, {**first, "math": mode}, "cuda").split("__global__", 1)[1] for mode in ("eager", "nocast")}
    assert body["eager"].count("fg_rbf(") == 1 and body["nocast"].count("fg_rbf(") == 0
    base = {"chunk": 1, "simd": 1}
    exact = _run_cpu(card, {**base, "math": "eager"}, ins, tmp_path / "eager")[0]
    loose = _run_cpu(card, {**base, "math": "nocast"}, ins, tmp_path / "nocast")[0]
    assert torch.equal(exact, run_program(card.program, [t.clone() for t in ins])[0])
    assert not torch.equal(loose, exact)
    xd = x.double()
    truth = w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert (loose.double() - truth).abs().mean() < (exact.double() - truth).abs().mean()
    # casts to fp32 alone round nothing: no such mode
    card2, _ = captured(lambda x, w: (w * x).float() * 2, x, w)
    assert "nocast" not in math_modes(analyze(card2), "cuda")


def test_math_modes_are_offered_where_they_change_the_kernel(table_ws):
    by = {(_name(c), c.dtype): c for c in table_ws.cards() if c.kind == "module"}
    gate = GEN.match(by[("GeluGate", "bfloat16")])
    assert GEN.axes(gate, "cuda")["math"] == ["eager", "fp32", "fast"]
    assert GEN.axes(gate, "cpu")["math"] == ["eager", "fp32"]  # no approximate functions on the cpu
    first = GEN.initial(gate, "cuda")
    assert first["math"] == "eager"
    # both other modes are one step away, the first moves tried (a compute-bound program), the
    # approximate functions last
    from forge_tui.templates.proposer import TemplateProposer

    assert [q["math"] for q in TemplateProposer().neighbours(GEN, gate, first, "cuda")[:2]] == ["fp32", "fast"]
    fast = GEN.render(gate, {**first, "math": "fast"}, "cuda")
    wide = GEN.render(gate, {**first, "math": "fp32"}, "cuda")
    eager = GEN.render(gate, first, "cuda")
    body = lambda src: src.split("__global__", 1)[1]  # noqa: E731
    assert "fg_gelu_tanh_fast(" in body(fast) and "fg_gelu_tanh(" in body(wide) + body(eager)
    # eager rounds gelu's result; the product is stored only, and the store rounds it
    assert body(eager).count("fg_rbf(") == 1 and body(wide).count("fg_rbf(") == 0
    # the model's own cast rounds in every mode: HalfCastChain's .half() (then the add's rounding,
    # which fp32 leaves out; the ELU's output is rounded by its store)
    chain = GEN.match(by[("HalfCastChain", "float16")])
    counts = [GEN.render(chain, {**GEN.initial(chain, "cpu"), "math": mode}, "cpu").split("forge_launch", 1)[1]
              .count("fg_rh(") for mode in ("eager", "fp32")]
    assert counts == [2, 1], counts
    # fp32 programs and programs without an op to round inside have eager's mode only
    for key in (("GeluGate", "float32"), ("GemmaRMSNorm", "bfloat16"), ("SiluGate", "float32")):
        if key in by:
            m = GEN.match(by[key])
            assert "math" not in GEN.axes(m, "cuda") and "math" not in GEN.initial(m, "cuda"), key
            assert not GEN.valid(m, {**GEN.initial(m, "cuda"), "math": "fp32"}, "cuda"), key


def test_the_elementwise_family_has_the_same_math_modes(table_ws):
    """The hand-written elementwise family keeps the gates it matches (priority), with the same
    ``math`` axis: eager rounds gelu's result, fp32 and fast do not; fast takes tanh.approx; the
    product is rounded once, by its store."""
    by = {(_name(c), c.dtype): c for c in table_ws.cards() if c.kind == "module"}
    fam, m = match(by[("GeluGate", "bfloat16")])
    assert fam.name == "elementwise"
    assert fam.axes(m, "cuda")["math"] == ["eager", "fp32", "fast"] and fam.axes(m, "cpu")["math"] == ["eager", "fp32"]
    first = fam.initial(m, "cuda")
    src = {mode: fam.render(m, {**first, "math": mode}, "cuda").split("fused(", 1)[1] for mode in ("eager", "fp32", "fast")}
    assert [src[k].count("ROUND_BFLOAT16(") for k in ("eager", "fp32", "fast")] == [1, 0, 0]
    assert "fg_tanh_fast(" in src["fast"] and "tanhf(" in src["fp32"] and "fg_tanh_fast(" not in src["fp32"]
    if ("GeluGate", "float32") in by:
        fam32, m32 = match(by[("GeluGate", "float32")])
        assert "math" not in fam32.axes(m32, "cuda")
    with Evaluator(table_ws.store, table_ws.cache, CFG, backend="cpu") as ev:
        for mode in ("eager", "fp32"):
            card = by[("GeluGate", "bfloat16")]
            r = ev.evaluate(card, fam.render(m, {**fam.initial(m, "cpu"), "math": mode}, "cpu"), EvalOptions(timing=False))
            assert r.status == "passed", (mode, r.reason)


def test_every_math_mode_passes_the_evaluator_on_the_cpu(table_ws):
    cards = [c for c in table_ws.cards() if c.kind == "module" and "math" in GEN.axes(GEN.match(c), "cpu")]
    assert {_name(c) for c in cards} >= {"GeluGate", "SoftCap", "HalfCastChain"}
    tried = set()
    with Evaluator(table_ws.store, table_ws.cache, CFG, backend="cpu") as ev:
        for card in cards:
            m = GEN.match(card)
            for mode in GEN.axes(m, "cpu")["math"][1:]:
                r = ev.evaluate(card, GEN.render(m, {**GEN.initial(m, "cpu"), "math": mode}, "cpu"),
                                EvalOptions(timing=False))
                assert r.status == "passed", (card.id, mode, r.reason)
                tried.add(mode)
    assert tried == {"fp32", "nocast"}


# ---- CUDA ----------------------------------------------------------------------------------------
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_sources_compile_for_sm90(table_ws):
    """The default suite's share of the build below: the sources rendered and checked as text, and
    one of each structure built (a folded rotary, a norm in registers and in shared memory, a group
    norm, the router's sub-warp rows, a one-launch GQA rotary, rows a thread, fast math, the
    family's eager math)."""
    _cuda_sources_compile_for_sm90(table_ws, every=False)


@pytest.mark.exhaustive
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.timeout(1200)
def test_every_cuda_source_of_the_table_compiles_for_sm90(table_ws):
    """The first configuration of a norm (registers), its shared-memory and re-read variants, a
    sub-warp row (tpr < 32), a rotary (flat, index arithmetic) and a softmax with a mask."""
    _cuda_sources_compile_for_sm90(table_ws, every=True)


def _cuda_sources_compile_for_sm90(table_ws, every: bool) -> None:
    by = {}
    for card in table_ws.cards():
        by.setdefault((_name(card), card.dtype), card)
    jobs = []
    gemma = GEN.match(by[("GemmaRMSNorm", "bfloat16")])
    first = GEN.initial(gemma, "cuda")
    for cache in ("regs", "smem", "none"):
        jobs.append(GEN.render(gemma, {**first, "cache": cache, "tpr": 32, "rpb": 2}, "cuda"))
    for name in ("HandGroupNorm", "Rotary", "ContiguousGroupNorm", "RouterMask"):
        card = next(c for (n, _), c in by.items() if n == name)
        m = GEN.match(card)
        jobs.append(GEN.render(m, {**GEN.initial(m, "cuda"), "fold": 1}, "cuda"))
    rot = GEN.match(next(c for (n, _), c in by.items() if n == "Rotary"))
    jobs.insert(0, GEN.render(rot, GEN.initial(rot, "cuda"), "cuda"))  # folded in two
    assert "folded 2 ways" in jobs[0] and "__builtin_assume" in jobs[0]
    gqa = GEN.match(next(c for (n, _), c in by.items() if n == "GQARotary"))
    jobs.append(GEN.render(gqa, GEN.initial(gqa, "cuda"), "cuda"))  # q and k: a kernel each
    assert "fg_kernel1<8><<<" in jobs[-1] and "q1[" not in jobs[-1].split("fg_kernel1")[0]
    jobs.append(GEN.render(gqa, {**GEN.initial(gqa, "cuda"), "launch": "one"}, "cuda"))  # or one launch
    assert "fg_domain1<VEC>(b - " in jobs[-1] and "fg_kernel1" not in jobs[-1]
    assert "fg_row_reduce<TPR, 1>" in jobs[-3] and "#define TPR 4" in jobs[-3]  # the router's 8 experts: 4 threads a row
    assert "load_vec<__nv_bfloat16, VEC>" in jobs[1] and "keep1[NV][VEC]" in jobs[1] and "fg_smem" in jobs[2]
    # unfolded, rotate_half's two halves are vector loads too: (c % 8) is contiguous within an aligned run
    assert "load_vec<float, VEC>(p0 + ro0 + (c0 % 8LL), v" in jobs[5], jobs[5][-2500:]
    jobs.append(GEN.render(gemma, {**first, "tpr": 16, "rpb": 2, "rpt": 2}, "cuda", FEW_SMS))  # rows a thread
    for name in ("GeluGate", "SoftCap"):
        m = GEN.match(by[(name, "bfloat16")])
        jobs += [GEN.render(m, {**GEN.initial(m, "cuda"), "math": mode}, "cuda") for mode in ("fast", "fp32")]
    fam, em = match(by[("GeluGate", "bfloat16")])
    jobs += [fam.render(em, {**fam.initial(em, "cuda"), "math": mode}, "cuda") for mode in ("eager", "fast", "fp32")]
    kernels = [src.split("__global__", 1)[1] for src in jobs[-7:-3]]  # gelu fast, fp32; soft cap fast, fp32
    assert "fg_gelu_tanh_fast(" in kernels[0] and "fg_tanh_fast(" in kernels[2] and "tanh.approx.f32" in jobs[-5]
    assert "_fast(" not in kernels[1] + kernels[3]
    if not every:  # the other sources differ from these in a constant or a math mode
        jobs = [jobs[i] for i in (0, 1, 2, 4, 7, 9, 10, 11, 15)]
    builder = Builder("cuda", Path(tempfile.mkdtemp(dir=table_ws.cache)), arch="sm_90")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(builder.build, jobs))
    bad = [r.log[:2000] for r in results if not r.ok]
    assert not bad, bad[0]


def test_a_channels_last_group_is_read_in_memory_order(table_ws):
    """A group norm over a channels-last tensor (clone, then the norm): its row, a group, is 2
    channels at each of 16 positions, 8 elements apart in memory. The kernel visits the columns
    in memory order (the channel innermost), so its loads are contiguous runs that vectorise,
    where the logical order read one element a 32-byte sector on the H200 (0.47-0.59x eager on
    the diffusion's 1x512x128x128)."""
    from forge_tui.codegen.index import to_c

    card = next(c for c in table_ws.cards() if _name(c) == "ContiguousGroupNorm")
    assert [n["op"] for n in card.program["nodes"]] == ["aten.clone.default", "aten.native_group_norm.default"]
    m = GEN.match(card)
    kern = m.info["kernel"]
    assert "columns in the input's memory order" in kern.summary
    x = next(n for n in kern.loads() if n.varying and n.attr[0] == 0)
    assert to_c(x.attr[1].split("c")[1]) == "(c % 2LL) + 8LL * (c / 2LL)", to_c(x.attr[1])
    assert GEN.axes(m, "cuda")["vec"][0] == 2
    for cache, load in (("none", "load_vec<float, VEC>(p0 + ro0 + (c0 % 2LL) + 8LL * (c0 / 2LL), v0);"),
                        ("regs", "load_vec<float, VEC>(p0 + ro0 + (c0 % 2LL) + 8LL * (c0 / 2LL), cache0[k]);")):
        src = GEN.render(m, {**GEN.initial(m, "cuda"), "vec": 2, "cache": cache}, "cuda")
        assert load in src, src[-3000:]
        # the output is the contiguous clone's layout: written where each column lands in it
        assert "q0[ro1 + 16LL * (c % 2LL) + (c / 2LL)]" in src, src[-3000:]


def test_register_loops_carry_values_instead_of_recomputing_them(table_ws):
    """With the row in registers, a later loop starts from the values an earlier one computed
    (the softmax's exponential once, not in both the sum's loop and the output's), and every
    value a loop uses is computed there, read from registers, or a row's constant."""
    from forge_tui.codegen.emit_cuda import carries, carry_plan

    by = {_name(c): c for c in table_ws.cards()}
    soft = GEN.match(by["MaskedSoftmax"])
    kern = soft.info["kernel"]
    assert carries(kern, "regs") and not carries(kern, "smem") and not carries(kern, "none")
    plan = carry_plan(kern)
    exps = [n.id for n in kern.nodes if n.op == "exp"]
    assert exps and [sum(e in need for need in plan.need) for e in exps] == [2] * len(exps)  # computed, then read
    for card in table_ws.cards():
        m = GEN.match(card)
        if m is None or not m.info["kernel"].reductions:
            continue
        k, plan = m.info["kernel"], carry_plan(m.info["kernel"])
        seen: set[int] = set()
        kept = {n for ph in plan.keep for n in ph}
        for need in plan.need:
            here = set(need)
            for n in need:
                if n in seen:  # from an earlier loop: kept, or a cached load
                    assert n in kept or (k.nodes[n].op == "load" and n in plan.loads), (card.id, n)
                    continue
                for a in k.nodes[n].args:
                    assert a in here or not k.nodes[a].varying, (card.id, n, a)
            seen |= here
    first = GEN.initial(soft, "cuda")
    regs = GEN.render(soft, {**first, "cache": "regs"}, "cuda")
    none = GEN.render(soft, {**first, "cache": "none", "tpr": 32, "rpb": 1}, "cuda")
    def body(src: str) -> str:
        return src[src.index("template <int VEC, int NV>"):src.index("FORGE_EXPORT")]

    assert body(regs).count("expf(") == 1 and body(none).count("expf(") == 2


# ---- nesting -------------------------------------------------------------------------------------
NESTED = '''
import torch
from torch import nn


class GemmaNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(64))

    def forward(self, x):
        o = x.float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (o * (1.0 + self.weight.float())).type_as(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = GemmaNorm()

    def forward(self, x):
        return self.norm(x) + torch.tanh(x)


def get_model():
    return Model()


def get_inputs():
    return [torch.randn(32, 64)]
'''


def _profiled(tmp_path, workload_source):
    """A workspace profiled on the CPU from a workload's source, timed briefly."""
    (tmp_path / "model.py").write_text(workload_source)
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n")
    ws, _ = profile_into_workspace(tmp_path / "model.py", tmp_path / "ws", device="cpu", config_path=cfg)
    return ws


def test_op_cards_nest_under_their_module_card_and_are_not_searched_apart(tmp_path):
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.table import offline_share, render

    ws = _profiled(tmp_path, NESTED)
    cards = ws.cards()
    module = next(c for c in cards if c.kind == "module")
    chain = next(c for c in cards if c.kind == "chain")  # the model's own tanh, then the add
    inner = [c for c in cards if c.kind == "op" and module.id in c.within]
    outer = [c for c in cards if c.kind == "op" and module.id not in c.within]
    assert {c.op_name for c in inner} >= {"pow", "mean", "rsqrt"} and all(c.within == [module.id] for c in inner)
    assert {c.op_name for c in outer} == {"tanh", "add"}  # made outside the module, each in the chain
    assert all(c.within == [chain.id] for c in outer) and chain.target == "chain:tanh+add"
    text = render(cards)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if module.id in line)
    assert all("└ " in line for line in lines[at + 1: at + 1 + len(inner)])
    assert "generated" in lines[at]  # the Gemma norm's kernel comes from the generator
    served = {module.id: "generated", outer[0].id: "elementwise", inner[0].id: "generated"}
    share = offline_share(cards, served)
    assert share["module"] == pytest.approx(module.share) and share["op"] == pytest.approx(outer[0].share)
    assert "serve" in text and "% of the forward" in text
    pool = LocalEvalPool(ws.store, ws.cache, CFG, backend="cpu")
    try:
        search = Search(ws, CFG, TemplateProposer(), pool)
        eligible = {c.id for c in search._eligible(cards)}
        alone = {c.id for c in Search(ws, CFG, TemplateProposer(), pool, cards=[inner[0].id])._eligible(cards)}
    finally:
        pool.close()
    assert module.id in eligible and not eligible & {c.id for c in inner}
    assert all("inside " + module.id in search.skipped[c.id] for c in inner)
    assert alone == {inner[0].id}  # named alone, without its module card, it is searched


IN_PLACE_MODEL = """
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 256)

    def forward(self, x):
        y = self.lin(x)
        y.relu_()  # in place, as torchvision's ReLU(inplace=True) after each batch norm
        return y.sum(-1)


def get_model():
    return M()


def get_inputs():
    return [torch.randn(512, 64)]
"""


def test_an_in_place_op_is_neither_searched_nor_counted_as_served(tmp_path):
    """The runtime never serves an op that changes its input in place (the model reads the input
    it changed; a kernel writes new outputs): the search does not spend evaluations on its card
    (ResNet-50's relu_ would get some, then "not used") and the op table does not count it in the
    share of the forward that offline kernels serve."""
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.table import served_by

    ws = _profiled(tmp_path, IN_PLACE_MODEL)
    cards = ws.cards()
    relu = next(c for c in cards if c.op_name == "relu_")
    total = next(c for c in cards if c.op_name == "sum")
    assert "mutates" in relu.flags and match(relu)[0] is not None  # a family has a kernel for its program
    served = served_by(cards)
    assert relu.coverage is not None and relu.coverage.proposer != "agent"  # covered, but never served
    assert relu.id not in served and total.id in served
    pool = LocalEvalPool(ws.store, ws.cache, CFG, backend="cpu")
    try:
        search = Search(ws, CFG, TemplateProposer(), pool, cards=[relu.id, total.id])
        eligible = {c.id for c in search._eligible(cards)}
    finally:
        pool.close()
    assert eligible == {total.id}
    assert search.skipped[relu.id] == "the runtime would never use its kernel: in-place ops are not served"


def test_unsupported_is_an_exception_with_the_reason():
    card = card_of(lambda x: torch.cumsum(x, 0) + 1, X)
    with pytest.raises(Unsupported, match="cumsum"):
        analyze(card)


@given(k=st.integers(2, 9), off=st.integers(0, 40), a=st.integers(1, 5))
@settings(max_examples=40, deadline=None, derandomize=True)
def test_a_split_index_folds_back(k, off, a):
    """a * k * (E / k) + a * (E % k) folds to a * E for an index E that floor and mod cannot
    simplify (an offset row-major position): what a rotate-half or chunk of a chunk leaves."""
    sp = Space({"r": 7, "c": 12})
    e = sp.offset(sp.add(sp.scale(sp.var("r"), 3), sp.var("c")), off)
    split = sp.add(sp.scale(sp.floordiv(e, k), a * k), sp.scale(sp.mod(e, k), a))
    rr, cc = torch.arange(7).view(-1, 1), torch.arange(12).view(1, -1)
    assert torch.equal(torch.as_tensor(evaluate(split, {"r": rr, "c": cc})), a * (rr * 3 + cc + off))
    assert split == sp.scale(e, a)


def test_a_folded_row_addresses_what_the_unfolded_one_does_and_reads_each_element_once(table_ws):
    """Folded P ways, a thread's part p reads and writes at column c + p * H (H = cols / P): every
    shifted offset equals the original one at that column, for every row and column of every
    pointwise program of the table; the rotary then reads each element of q once (its rotate-half
    partner is the other part's own element), where the unfolded kernel reads q three times a
    column (at c, at c % H + H and at c % H)."""
    from forge_tui.codegen.emit_cuda import fold_gains, fold_loads
    from forge_tui.codegen.emit_cuda.flat import _shifted

    checked = 0
    for card in table_ws.cards():
        k = analyze(card)
        if k.reductions:
            continue
        for parts in (2, 4):
            if k.cols % parts:
                continue
            h = k.cols // parts
            sp = Space({"r": k.rows, "c": h})
            rr, cc = torch.arange(k.rows).view(-1, 1), torch.arange(h).view(1, -1)
            offs = [n.attr[1] for n in k.loads()] + [o.offset for o in k.outputs]
            for off in offs:
                for part in range(parts):
                    got = torch.as_tensor(evaluate(_shifted(off, part * h, sp), {"r": rr, "c": cc}))
                    want = torch.as_tensor(evaluate(off, {"r": rr, "c": cc + part * h}))
                    assert torch.equal(got.expand(k.rows, h), want.expand(k.rows, h)), (_name(card), parts, part, off)
                    checked += 1
    assert checked > 100
    rot = next(c for c in table_ws.cards() if _name(c) == "Rotary" and c.dtype == "float32")
    k = analyze(rot)
    q = next(i for i, s in enumerate(rot.inputs) if list(s.shape) == [2, 4, 8, 16])
    unfolded = [n for n in k.loads() if n.attr[0] == q]
    assert len(unfolded) == 3
    folded, scalar = fold_loads(k, 2, 4)
    assert scalar == 0 and len([1 for leaf, _ in folded if leaf == q]) == 2  # two parts, each q once
    assert fold_gains(k, 2, 4) and not fold_gains(analyze(next(c for c in table_ws.cards() if _name(c) == "SoftCap")), 2, 4)
    m = GEN.match(rot)
    assert GEN.initial(m, "cuda")["fold"] == 2 and 2 in GEN.axes(m, "cuda")["fold"]
    src = GEN.render(m, GEN.initial(m, "cuda"), "cuda")
    assert src.count(f"load_vec<float, VEC>(p{q} + ") == 2 and "folded 2 ways" in src


def test_one_launch_for_outputs_of_different_sizes_gives_each_size_its_whole_grid(table_ws):
    """The GQA rotary's q and k in one launch: the blocks are split among the sizes in turn, the
    ranges tile the launch's grid exactly at the vector width and at 1 (the unaligned fallback),
    and each size gets the grid its own kernel would launch with."""
    import re

    card = next(c for c in table_ws.cards() if _name(c) == "GQARotary")
    m = GEN.match(card)
    k = GEN._k(m)
    assert [(d.rows, d.cols) for d in k.domains] == [(2 * 4 * 8, 16), (2 * 2 * 8, 16)]
    assert GEN.axes(m, "cuda")["launch"] == ["each", "one"]
    # the search's first move from the initial kernel: one launch (the 2026-12-03 H200 run's ten
    # evaluations of this card never reached it, the axis being the proposer's last)
    from forge_tui.templates.proposer import TemplateProposer

    first = GEN.initial(m, "cuda")
    assert TemplateProposer().neighbours(GEN, m, first, "cuda")[0] == {**first, "launch": "one"}
    for threads in (128, 256):
        p = {**GEN.initial(m, "cuda"), "threads": threads, "launch": "one"}
        assert GEN.valid(m, p, "cuda") and not GEN.valid(m, {**p, "grid": "waves4"}, "cuda")
        one = GEN.render(m, p, "cuda")
        each = GEN.render(m, {**p, "launch": "each"}, "cuda")
        own = [(_blocks(a), _blocks(b)) for a, b in re.findall(
            r"fg_kernel1?<\d+><<<(\(unsigned\)\(\(\d+LL \+ \d+\) / \d+\)), \d+, 0, s>>>.*\n"
            r"    else fg_kernel1?<1><<<(\(unsigned\)\(\(\d+LL \+ \d+\) / \d+\)),", each)]
        assert len(own) == 2, each[-1500:]
        rows = re.findall(r"if \(b < \(VEC == 1 \? (\d+)u : (\d+)u\)\) \{ fg_domain(\d)<VEC>\(b - \(VEC == 1 \? (\d+)u : (\d+)u\), "
                          r"VEC == 1 \? (\d+)u : (\d+)u", one)
        assert [int(r[2]) for r in rows] == [0, 1]
        grid = [int(x) for x in re.search(r"fg_kernel<\d+><<<(\d+),.*\n    else fg_kernel<1><<<(\d+),", one).groups()]
        for vec1 in (0, 1):  # 0: the VEC instantiation, 1: VEC = 1
            start = 0
            for d, r in enumerate(rows):
                end, base, n = int(r[1 - vec1]), int(r[4 - vec1]), int(r[6 - vec1])
                assert base == start and end == start + n and n == own[d][vec1], (vec1, d, r, own)
                start = end
            assert start == grid[vec1]


def test_the_card_pane_names_the_offline_kernel_or_why_none(table_ws):
    """What the app's card pane says of a card: the family that serves it, else the generator's
    one-line reason (the op it does not know)."""
    from forge_tui.cards import TensorSpec
    from forge_tui.ui.widgets.workload.card_detail import offline_line

    gemma = next(c for c in table_ws.cards() if c.target == "module:GemmaRMSNorm")
    assert offline_line(gemma) == "offline kernel: generated"
    x = TensorSpec(shape=[4, 8], stride=[8, 1], dtype="float32", role="input")
    mm = Card(id="mm-x", label="mm", kind="op", target="aten.mm.default", device="cpu",
              inputs=[x, x.model_copy(update={"shape": [8, 4], "stride": [4, 1]})],
              outputs=[x.model_copy(update={"shape": [4, 4], "stride": [4, 1], "role": "output"})],
              program={"nodes": [{"op": "aten.mm.default", "args": [{"$in": 0}, {"$in": 1}], "kwargs": {},
                                  "out": [[[4, 4], "float32"]]}], "outputs": [{"$node": 0, "out": 0}]})
    line = offline_line(mm)
    assert line.startswith("offline kernel: none (") and "mm over an inner dimension of 8" in line and "\n" not in line


LONG_GROUPS = '''
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(8, 64)

    def forward(self, x):
        return self.norm(x)


def get_model():
    return Model()


def get_inputs():
    return [torch.randn(1, 64, 64, 64)]
'''


def test_few_long_rows_are_split_over_a_cluster(tmp_path):
    """A group norm of 8 groups of 32768 elements: one block a group would use 8 of the H200's 132
    SMs. The first configuration splits each group over a cluster of blocks (16), the row in
    registers; its source combines the blocks' partial sums through distributed shared memory,
    lets only rank 0 store a row's own results, and launches clusters. Many rows, a block per
    row group, a shared-memory cache or a GPU without clusters keep one block a row. The split
    source compiles for sm_90 where nvcc is present."""
    from dataclasses import replace

    from forge_tui.kernels.device import H200

    (tmp_path / "long.py").write_text(LONG_GROUPS)
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n")
    ws, _ = profile_into_workspace(tmp_path / "long.py", tmp_path / "ws", device="cpu", config_path=cfg)
    card = next(c for c in ws.cards() if "group_norm" in c.target)
    m = GEN.match(card)
    kern = m.info["kernel"]
    assert (kern.rows, kern.cols) == (8, 32768)
    first = GEN.initial(m, "cuda")
    assert first["split"] == 16 and first["cache"] == "regs" and first["rpb"] == 1, first
    assert GEN.valid(m, first, "cuda")
    src = GEN.render(m, first, "cuda")
    assert "#define SPLIT 16" in src and "cudaLaunchAttributeClusterDimension" in src
    assert "NonPortableClusterSizeAllowed" in src  # 16 blocks: past the portable 8
    assert src.count("fg_cluster_comb<0>(&fg_part[") == len(kern.reductions) >= 1, src[-4000:]
    assert "((k * SPLIT + rank) * TPR + t) * VEC" in src
    assert any(o.per_row for o in kern.outputs) and "if (live && t == 0 && rank == 0) {" in src  # mean, rstd
    for bad in ({"cache": "smem"}, {"grid": "waves"}, {"rpb": 2, "tpr": 256}):
        assert not GEN.valid(m, {**first, **bad}, "cuda"), bad
    old = replace(H200, capability=(8, 0))
    assert GEN.axes(m, "cuda", old)["split"] == [1] and not GEN.valid(m, first, "cuda", old)
    assert GEN.initial(m, "cuda", old)["split"] == 1
    # one block a row where the rows fill the GPU
    many = replace(H200, sms=8)
    assert GEN.initial(m, "cuda", many)["split"] == 1 and not GEN.valid(m, {**first, "split": 2}, "cuda", many)
    # a re-read (none) configuration walks the block's columns with a cluster-wide stride
    none = GEN.render(m, {**first, "cache": "none", "split": 4}, "cuda")
    assert "c0 += SPLIT * TPR * VEC" in none and "#define SPLIT 4" in none
    if shutil.which("nvcc") is None:
        return
    builder = Builder("cuda", tmp_path / "build", arch="sm_90")
    for job in (src, none, GEN.render(m, {**first, "split": 1, "tpr": 1024, "cache": "none"}, "cuda")):
        r = builder.build(job)
        assert r.ok, r.log[:3000]


CHANNELS_LAST_GROUPS = LONG_GROUPS.replace("torch.randn(1, 64, 64, 64)",
                                           "torch.randn(1, 64, 32, 32).to(memory_format=torch.channels_last)")


def test_interleaved_rows_are_walked_in_memory_order(tmp_path):
    """A channels-last group norm: each group's elements are runs of 8 channels, the groups' runs
    side by side (a pixel's 64 channels a period). The generator sees the layout, and its first
    configuration walks the tensor in memory order ("tiles": a cooperative grid of blocks on every
    SM, each thread one group's elements, the partial sums combined in a stream-ordered workspace
    behind a grid barrier), where a block a group reads 32-byte runs 256 bytes apart. Flat memory
    position m is group (m / 8) % 8, column m % 8 + 8 (m / 64): every element once. The same
    norm in NCHW has no such axis; the source compiles for sm_90 where nvcc is present."""
    from forge_tui.codegen.emit_cuda import tile_layout
    from forge_tui.kernels.device import H200

    (tmp_path / "cl.py").write_text(CHANNELS_LAST_GROUPS)
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n")
    ws, _ = profile_into_workspace(tmp_path / "cl.py", tmp_path / "ws", device="cpu", config_path=cfg)
    card = next(c for c in ws.cards() if "group_norm" in c.target)
    m = GEN.match(card)
    kern = m.info["kernel"]
    assert (kern.rows, kern.cols) == (8, 8192)
    lay = tile_layout(kern)
    assert lay is not None and (lay.rl, lay.per) == (8, 64)
    flat = torch.arange(kern.rows * kern.cols)
    rows, cols = (flat // lay.rl) % kern.rows, flat % lay.rl + lay.rl * (flat // lay.per)
    assert torch.equal(evaluate(lay.ref, {"r": rows, "c": cols}), flat)
    assert len(set((rows * kern.cols + cols).tolist())) == flat.numel()

    first = GEN.initial(m, "cuda")
    assert first["grid"] == "tiles" and GEN.valid(m, first, "cuda"), first
    src = GEN.render(m, first, "cuda")
    assert "cudaLaunchAttributeCooperative" in src and "cooperative_groups::this_grid().sync();" in src
    assert src.count("cooperative_groups::this_grid().sync();") == kern.levels == 2
    assert "FORGE_EXPORT int forge_launch_ws(" in src and "forge_workspace_bytes" in src
    assert "cudaMalloc" not in src  # the caller's stream-ordered workspace
    assert "fg_st<float, VEC, AL>(q0 + m0, o0);" in src  # the output in memory order, a vector a store
    assert "if (blockIdx.x == 0) q1[" in src and "if (t < NR) {" in src  # mean and rstd: a thread a group
    assert "/* the transposed outputs */" not in src
    for bad in ({"split": 2}, {"rpb": 2}, {"tpr": 1024, "bps": 4}, {"vec": 8}):
        assert not GEN.valid(m, {**first, **bad}, "cuda"), bad
    assert GEN.valid(m, {**first, "cache": "none"}, "cuda")
    assert not GEN.valid(m, {**first, "grid": "rows", "bps": 2}, "cuda")  # bps is the tiles grid's
    # the same norm in NCHW: rows of contiguous columns, no tiles
    (tmp_path / "nchw.py").write_text(LONG_GROUPS.replace("64, 64, 64", "64, 32, 32"))
    ws2, _ = profile_into_workspace(tmp_path / "nchw.py", tmp_path / "ws2", device="cpu", config_path=cfg)
    m2 = GEN.match(next(c for c in ws2.cards() if "group_norm" in c.target))
    assert tile_layout(m2.info["kernel"]) is None and "tiles" not in GEN.axes(m2, "cuda")["grid"]
    assert GEN.initial(m2, "cuda", H200)["grid"] != "tiles"
    # a channels-last view the group norm first copies to NCHW (the diffusion's VAE): read in
    # memory order, written transposed, a thread a channel's run of pixels from the block's chunk
    (tmp_path / "tr.py").write_text(LONG_GROUPS.replace(
        "torch.randn(1, 64, 64, 64)", "torch.randn(64 * 32 * 32).as_strided((1, 64, 32, 32), (64, 1, 2048, 64))"))
    ws3, _ = profile_into_workspace(tmp_path / "tr.py", tmp_path / "ws3", device="cpu", config_path=cfg)
    m3 = GEN.match(next(c for c in ws3.cards() if c.id.startswith("mod-GroupNorm")))
    lay3 = tile_layout(m3.info["kernel"])
    assert lay3 is not None and lay3.transposed and m3.info["kernel"].outputs[0].offset == lay3.trans
    first3 = GEN.initial(m3, "cuda")
    assert first3["grid"] == "tiles" and first3["cache"] == "smem", first3
    assert not GEN.valid(m3, {**first3, "cache": "regs"}, "cuda")  # the transpose reads the block's chunk
    src3 = GEN.render(m3, first3, "cuda")
    assert "/* the transposed outputs */" in src3 and "to_f(sm0[(pl + j) * PER + ch])" in src3
    assert "fg_st<float, VEC, AL>(q0 + " in src3 and "(c0 / 8LL), o0);" in src3
    from forge_tui.evaluator.static_checks import check_source, errors

    for job in (src, src3):  # the judge's rules: no state kept between calls, no allocation of its own
        assert not errors(check_source(job, "cuda")), errors(check_source(job, "cuda"))
    if shutil.which("nvcc") is None:
        return
    builder = Builder("cuda", tmp_path / "build", arch="sm_90")
    for job in (src, src3):  # about 9 s a build on CI's cores: the two output phases
        r = builder.build(job)
        assert r.ok, r.log[:3000]
