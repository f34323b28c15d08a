"""Profiling a generation into range cards (``forge profile --generate N``): prefill and decode
steps apart, calls that differ only in a size that varies by step as one card."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from forge_tui.cards import load_cards
from forge_tui.ranges import at_sizes, checked_sizes, dense_strides, dim_order, size_points

PROMPT, NEW = 8, 9  # a prefill at KV length 8, then decode steps at KV lengths 9..16

WORKLOAD = textwrap.dedent(f"""
    from forge_tui.examples import tiny_decoder as base
    from forge_tui.examples._decoder_parts import decoder_inputs

    def get_model():
        return base.get_model()

    def get_inputs():
        return decoder_inputs(base.CONFIG, 1, {PROMPT})

    generate = base.generate
""")


@pytest.fixture(scope="module")
def gen_workspace(tmp_path_factory):
    from conftest import FAST_TOML

    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("genprof")
    (root / "forge.toml").write_text(FAST_TOML)
    (root / "gen_decoder.py").write_text(WORKLOAD)
    ws, result = profile_into_workspace(root / "gen_decoder.py", root / "ws", device="cpu",
                                        config_path=root / "forge.toml", generate=NEW)
    return ws, result


def _kv_product(cards):
    """The attention's scores product q @ k^T: a bmm whose second operand's last dim is the KV length."""
    return [c for c in cards if c.target == "aten.bmm.default" and "input1.dim2" in c.ranges and c.inputs[1].shape[1] == 16]


def test_decode_steps_make_one_range_card_with_phases(gen_workspace):
    ws, result = gen_workspace
    cards = load_cards(ws.root / "cards")
    (scores,) = _kv_product(cards)
    kv = scores.ranges["input1.dim2"]
    assert (kv.min, kv.max) == (PROMPT, PROMPT + NEW - 1)
    layers = 2
    assert kv.sizes() == {n: layers for n in range(PROMPT, PROMPT + NEW)}  # every step's calls, weighted
    assert scores.ranges["output0.dim2"].same_as == "input1.dim2"
    assert scores.phases == {"prefill": layers, "decode": layers * (NEW - 1)}
    assert scores.calls == layers * NEW
    assert scores.share == pytest.approx(sum(scores.phase_share.values()))
    assert scores.phase_share["decode"] > 0 and scores.phase_share["prefill"] > 0
    # the inputs kept: the most weighted size's and the range's ends'
    assert len({json.dumps(s.point, sort_keys=True) for s in scores.samples}) >= 2
    # no exact-shape card of one decode step is left beside it
    assert not [c for c in cards if c.target == "aten.bmm.default" and not c.ranges]
    assert result.generate == NEW


def test_op_table_shows_prefill_and_decode_shares(gen_workspace):
    ws, _ = gen_workspace
    text = (ws.root / "optable.txt").read_text()
    assert "share (prefill/decode)" in text
    (scores,) = _kv_product(load_cards(ws.root / "cards"))
    p, d = (100 * scores.phase_share[k] for k in ("prefill", "decode"))
    assert f"({p:.1f}/{d:.1f})" in text
    assert f"{PROMPT}..{PROMPT + NEW - 1}" in scores.shapes()


def test_forward_profile_keeps_exact_cards(decoder_workspace):
    for c in load_cards(decoder_workspace.root / "cards"):
        assert not c.ranges and not c.phases
        raw = json.loads((decoder_workspace.root / "cards" / f"{c.id}.json").read_text())
        assert "ranges" not in raw and "phases" not in raw


def test_generate_below_two_tokens_is_refused(tmp_path):
    from forge_tui.errors import ForgeError
    from forge_tui.workspace import profile_into_workspace

    with pytest.raises(ForgeError, match="at least 2 new tokens"):
        profile_into_workspace("example:tiny_decoder", tmp_path / "ws", device="cpu", generate=1)
    assert not (tmp_path / "ws").exists()


def test_layouts_and_sizes_of_a_range():
    assert dim_order([8, 16, 10], [160, 1, 16]) == (0, 2, 1)  # a transposed view of a growing cache
    assert dense_strides([8, 16, 13], (0, 2, 1)) == [208, 1, 16]
    assert dim_order([8, 16, 10], [0, 1, 16]) is None  # broadcast: not dense
    # a decode step's q, [batch, rows, heads, dim] transposed to [1, 4, 1, 16]: its one row keeps
    # its place outside the heads when the rows are ranged, so the prefill's 8 rows lie there too
    q = ([1, 4, 1, 16], [64, 16, 64, 1])
    assert dim_order(*q) == (1, 3) and dim_order(*q, keep=[2]) == (2, 1, 3)
    assert dense_strides([1, 4, 8, 16], (2, 1, 3)) == [512, 16, 64, 1]
    assert dim_order([1, 4, 1, 16], [64, 16, 7, 1], keep=[2]) == (1, 3)  # a stride that fits no place
    from forge_tui.cards import DimRange

    sizes = checked_sizes(DimRange(min=8, max=16, weights={}))
    assert sizes[0] == 8 and sizes[-1] == 16
    assert any(n % 2 for n in sizes[1:-1]) and any(n in (11, 13) for n in sizes)


def test_card_at_a_size_of_its_range(gen_workspace):
    ws, _ = gen_workspace
    # a card ranged over two sizes (the scores' rows and KV length): its own samples are labelled
    # with its own inputs' sizes, which the most weighted size of each dimension need not be
    (soft,) = [c for c in ws.cards() if c.target == "aten._softmax.default" and c.ranges]
    own = {k: soft.inputs[0].shape[int(k[-1])] for k in soft.ranges if k.startswith("input0.")}
    assert soft.samples and soft.samples[0].point == own
    (scores,) = _kv_product(load_cards(ws.root / "cards"))
    points = size_points(scores)
    assert {p["input1.dim2"] for p in points} >= {PROMPT, PROMPT + NEW - 1}
    exact = at_sizes(scores, {**points[0], "input1.dim2": 13})
    assert exact.inputs[1].shape[2] == 13 and exact.outputs[0].shape[2] == 13
    assert exact.inputs[1].stride == dense_strides(exact.inputs[1].shape, dim_order(scores.inputs[1].shape,
                                                                                    scores.inputs[1].stride))


# ---- kernels that serve a range, guards by shape class ---------------------------------------------

def _cpu_evaluator(ws):
    """The workspace's evaluator on the cpu backend, timing that tolerates a shared machine."""
    from forge_tui.config import parse_config
    from forge_tui.evaluator import Evaluator

    cfg = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}})
    return Evaluator(ws.store, ws.cache, cfg, backend="cpu")


def _range_norm(cards):
    """The decoder layers' RMSNorm module card, over the rows of the prefill and the decode steps."""
    (norm,) = [c for c in cards if c.target == "module:RMSNorm" and "input0.dim1" in c.ranges]
    return norm


@pytest.fixture(scope="module")
def range_kernel(gen_workspace):
    """(workspace, RMSNorm range card, its rownorm kernel's source, the evaluation)."""
    from forge_tui.promotion import promote_kernel
    from forge_tui.templates.registry import match

    ws, _ = gen_workspace
    norm = _range_norm(ws.cards())
    fam, m = match(norm)
    assert fam is not None and m is not None and fam.name == "rownorm"
    src = fam.render(m, fam.initial(m, "cpu"), "cpu")
    with _cpu_evaluator(ws) as ev:
        r = ev.evaluate(norm, src)
        assert r.correct, r.reason
        rows = norm.ranges["input0.dim1"]
        for n in range(rows.min, rows.max + 1):  # and every size of the range, one by one
            from forge_tui.evaluator.api import EvalOptions

            one = ev.evaluate(at_sizes(norm, {"input0.dim1": n}), src, EvalOptions(timing=False))
            assert one.correct, (n, one.reason)
        baked = fam.render(m.__class__(m.family, m.card, {**m.info, "ranged": False}), fam.initial(m, "cpu"), "cpu")
        wrong = ev.evaluate(norm, baked)  # the same kernel with the card's row count baked in
    promote_kernel(ws, norm.id, src, r, by="test")
    return ws, norm, src, r, wrong


def test_range_kernel_checked_at_ends_odd_and_prime_sizes(range_kernel):
    _, norm, _, r, wrong = range_kernel
    rows = norm.ranges["input0.dim1"]
    checked = {p["input0.dim1"] for p in r.detail["range"]["checked"]}
    assert {rows.min, rows.max} <= checked and any(n % 2 for n in checked)
    assert r.detail["range"]["timed_at"] == {"input0.dim1": max(rows.sizes(), key=rows.sizes().__getitem__)}
    assert r.time_us is not None
    # a kernel that serves one size only fails at another, named in the reason
    assert not wrong.correct and "at sizes input0.dim1=" in wrong.reason


def test_family_that_cannot_serve_a_range_says_why(gen_workspace):
    from forge_tui.templates.registry import match, range_refusals

    ws, _ = gen_workspace
    # the softmax family compiles every size in, so the generator serves the scores' softmax
    (soft,) = [c for c in ws.cards() if c.target == "aten._softmax.default" and c.ranges]
    fam, _ = match(soft)
    assert fam is not None and fam.name == "generated"
    assert [line.split(":")[0] for line in range_refusals(soft)] == ["softmax"]
    # the cache's cat along the KV length: its output's length follows no input's, so nothing serves it
    grown = [c for c in ws.cards() if c.target == "aten.cat.default" and c.ranges
             and any(r.same_as is None for k, r in c.ranges.items() if k.startswith("output"))]
    assert grown and all(match(c) == (None, None) for c in grown)
    for card in grown:
        reasons = range_refusals(card)
        assert reasons and all(len(line.splitlines()) == 1 for line in reasons)
        assert "follows no input dimension's" in reasons[0] and reasons[-1].startswith("generated:")
        # the card pane's line says the same
        assert card.coverage.proposer == "agent"
        assert card.coverage.why_not == ("no kernel serves aten.cat.default over its range: " + "; ".join(reasons) +
                                         " (left to the LLM agent)")


def test_guard_serves_the_range_and_falls_back_outside(range_kernel):
    import torch

    from forge_tui.generation import GreedyRunner, adapter_for
    from forge_tui.ranges import OUTSIDE_RANGE
    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    ws, norm, _, _, _ = range_kernel
    wl = load_workload(ws.root / "workload.py")
    model, inputs = wl.build("cpu")
    model.eval()
    with torch.no_grad():
        eager = wl.module.generate(model, inputs, max_new_tokens=NEW)  # the model's own greedy loop
        with apply(model, ws.root, only_faster=False) as applied:
            runner = GreedyRunner(adapter_for(model), max_len=PROMPT + NEW, capture=None)
            served = runner.generate(inputs[0], NEW).tokens
            st = applied.board.cards[norm.id]
            assert st.active and st.served >= 2 * 2 * NEW  # two norms a layer, every step
            assert not st.fallbacks
            longer = torch.randint(0, 256, (1, norm.ranges["input0.dim1"].max + 3))
            model(longer)
            assert st.fallbacks[OUTSIDE_RANGE] >= 4
            served_before = st.served
            model(longer[:, :PROMPT - 1])  # inside the range again: served
            assert st.served > served_before
    assert torch.equal(served, eager)


def test_a_range_card_in_a_compiled_model_is_sized_by_each_call(range_kernel):
    """Under torch.compile a module card is a custom op whose fake outputs tell the compiler their
    shapes: a range card's follow the call's inputs (a prefill's rows, a step's one), not the
    card's most weighted size, and the compiled greedy tokens are eager's."""
    import torch

    from forge_tui.generation import adapter_for
    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    ws, norm, _, _, _ = range_kernel
    wl = load_workload(ws.root / "workload.py")
    model, inputs = wl.build("cpu")
    model.eval()
    with torch.no_grad():
        eager = wl.module.generate(model, inputs, max_new_tokens=NEW)
        with apply(model, ws.root, mode="torch_compile", only_faster=False) as applied:
            ad = adapter_for(model)
            compiled = ad.with_forward(torch.compile(ad.model, backend=applied.backend("eager"), dynamic=False))
            got = compiled.static_generate(inputs[0], NEW)
            st = applied.board.cards[norm.id]
            assert st.served >= 2 * 2 * NEW and not st.fallbacks  # two norms a layer, the prefill and each step
    assert torch.equal(got, eager)


def test_elementwise_serves_a_range_where_its_index_does_not_change(gen_workspace):
    from forge_tui.templates.registry import match, range_refusals

    ws, _ = gen_workspace
    (silu,) = [c for c in ws.cards() if c.target == "aten.silu.default" and c.ranges]
    fam, m = match(silu)
    assert fam is not None and m is not None and fam.name == "elementwise"
    for backend in ("cpu", "cuda"):  # the element count read from the output, not compiled in
        src = fam.render(m, fam.initial(m, backend), backend)
        assert "const int64_t NUMEL = forge_numel(&out[0]);" in src
    with _cpu_evaluator(ws) as ev:
        r = ev.evaluate(silu, fam.render(m, fam.initial(m, "cpu"), "cpu"))
    assert r.correct, r.reason
    # the attention's mask add: the mask is broadcast along ranged dimensions
    (masked,) = [c for c in ws.cards() if c.target == "aten.add.Tensor" and len(c.inputs) == 2
                 and len(c.inputs[1].shape) == 2 and c.ranges]
    assert any(line.startswith("elementwise: input 1") for line in range_refusals(masked))


def test_a_workload_that_cannot_generate_is_refused_in_one_line(tmp_path):
    from forge_tui.errors import WorkloadError
    from forge_tui.workspace import profile_into_workspace

    with pytest.raises(WorkloadError, match=r"--generate needs a generate\(model, inputs\) function") as err:
        profile_into_workspace("example:tiny_mlp", tmp_path / "ws", device="cpu", generate=4)
    assert len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "ws").exists()


def _rotary(ws):
    """The attention's rotary chain over q's heads and k's, the prefill's rows and each step's one."""
    (rot,) = [c for c in ws.cards() if c.kind == "chain" and c.op_name == "mul+slice+slice+neg+cat+mul+add"]
    return rot


@pytest.fixture(scope="module")
def rotary_kernel(gen_workspace):
    """(the rotary range card, the generator's cpu source for its range, the evaluation)."""
    from forge_tui.templates.registry import match

    ws, _ = gen_workspace
    rot = _rotary(ws)
    fam, m = match(rot)
    assert fam is not None and m is not None and fam.name == "generated"
    src = fam.render(m, fam.initial(m, "cpu"), "cpu")
    with _cpu_evaluator(ws) as ev:
        r = ev.evaluate(rot, src)
    return rot, src, r


def test_the_generator_serves_a_chain_over_its_range(gen_workspace, rotary_kernel):
    """The rotary chain ranges over the heads (q's 4, k's 2) and the rows (the prefill's 8, each
    step's 1): its generated source reads both at run time, with a variant of its own for one
    row, and is right at every size of the range, checked one by one."""
    import itertools

    from forge_tui.evaluator.api import EvalOptions

    ws, _ = gen_workspace
    rot, src, r = rotary_kernel
    assert r.correct, r.reason
    heads, rows = rot.ranges["input0.dim1"], rot.ranges["input0.dim2"]
    assert (heads.min, heads.max, rows.min, rows.max) == (2, 4, 1, PROMPT)
    assert "const int64_t fg_n1 = in[0].shape[2];" in src and "if (in[0].shape[2] == 1) return fg_v0::" in src
    with _cpu_evaluator(ws) as ev:
        for h, n in itertools.product(range(heads.min, heads.max + 1), range(rows.min, rows.max + 1)):
            point = {"input0.dim1": h, "input0.dim2": n, "input1.dim2": n, "input2.dim2": n}
            one = ev.evaluate(at_sizes(rot, point), src, EvalOptions(timing=False))
            assert one.correct, (h, n, one.reason)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_generated_range_source_builds_for_cuda(gen_workspace):
    """The cuda source of the rotary's range: its kernels take the sizes as parameters."""
    import tempfile
    from pathlib import Path

    from forge_tui.evaluator.build import Builder
    from forge_tui.templates.registry import match

    ws, _ = gen_workspace
    fam, m = match(_rotary(ws))
    src = fam.render(m, fam.initial(m, "cuda"), "cuda")
    assert "fg_kernel(const int64_t fg_n0, const int64_t fg_n1, " in src
    built = Builder("cuda", Path(tempfile.mkdtemp(dir=ws.cache)), arch="sm_90").build(src)
    assert built.ok, built.log[:2000]


def test_a_generated_range_kernel_serves_the_prefill_and_the_steps(gen_workspace, rotary_kernel):
    """The rotary's range kernel promoted (a chain: served in compiled scopes) serves q and k in
    the prefill and at every decode step, and the greedy tokens are eager's. The two attention
    layers differ in ``layer_idx``, an integer Dynamo guards: the second layer's first call
    compiles a variant of the copy the layers share, and from then on it compiles a copy of its
    own, else its steps would find the shared copy at its limit of variants and run as written."""
    import torch

    from forge_tui.promotion import promote_kernel

    ws, _ = gen_workspace
    rot, src, r = rotary_kernel
    if not (ws.root / "kernels" / rot.id).exists():
        promote_kernel(ws, rot.id, src, r, by="test")
    eager, got, st, scopes = _generate_applied(ws, rot.id, compiled=True)
    layers = 2
    assert st.served == layers * 2 * NEW and not st.fallbacks, (st.served, st.fallbacks)
    assert [s.shared for s in scopes] == [True, False]
    assert torch.equal(got, eager)


def _generate_applied(ws, card_id: str, compiled: bool):
    """(eager's greedy tokens, the runner's with ``card_id`` applied, the card's status, the
    apply's scopes): the workspace's workload generating NEW tokens from its PROMPT-token prompt."""
    import torch

    from forge_tui.generation import GreedyRunner, adapter_for
    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    wl = load_workload(ws.root / "workload.py")
    model, inputs = wl.build("cpu")
    model.eval()
    with torch.no_grad():
        eager = wl.module.generate(model, inputs, max_new_tokens=NEW)
        with apply(model, ws.root, cards=[card_id], only_faster=False, compiled_scopes=compiled) as applied:
            got = GreedyRunner(adapter_for(model), max_len=PROMPT + NEW, capture=None).generate(inputs[0], NEW).tokens
            return eager, got, applied.board.cards[card_id], list(applied.scopes.values())


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-scope", "intercepted-scope"])
def test_an_op_range_card_is_served_at_every_size_in_a_scope(gen_workspace, compiled):
    """An op card over a range (the MLP's SiLU over the prefill's rows and each step's one) is
    served in the prefill and at every decode step, in a compiled scope (its graph's site matched by
    shape class, as the guard matches a call) as in an intercepted one, and the greedy tokens are
    eager's. Placed last: the workspace it promotes into is the module's."""
    import torch

    from forge_tui.promotion import promote_kernel
    from forge_tui.templates.registry import match

    ws, _ = gen_workspace
    (silu,) = [c for c in ws.cards() if c.target == "aten.silu.default" and c.ranges]
    assert (silu.ranges["input0.dim1"].min, silu.ranges["input0.dim1"].max) == (1, PROMPT)
    if not (ws.root / "kernels" / silu.id).exists():
        fam, m = match(silu)
        src = fam.render(m, fam.initial(m, "cpu"), "cpu")
        with _cpu_evaluator(ws) as ev:
            r = ev.evaluate(silu, src)
        assert r.correct, r.reason
        promote_kernel(ws, silu.id, src, r, by="test")
    eager, got, st, scopes = _generate_applied(ws, silu.id, compiled)
    assert (len(scopes) > 0) == compiled
    layers = 2
    assert st.served == layers * NEW and not st.fallbacks, (st.served, st.fallbacks)
    assert torch.equal(got, eager)
