"""Operator capture: granularities, skip rules, signatures, and references that reproduce eager."""

import pytest
import torch

from forge_tui.config import parse_config
from forge_tui.inputs import sample_inputs, sample_outputs
from forge_tui.profiler.capture import CaptureOptions, Recorder
from forge_tui.profiler.run import profile_workload
from forge_tui.program import run_program
from forge_tui.tensorstore import TensorStore
from forge_tui.workload import load_workload

TINY = ["tiny_mlp", "tiny_decoder", "tiny_moe", "tiny_diffusion", "tiny_resnet", "kb_softmax"]


def capture(model, inputs, **profile):
    rec = Recorder(model, CaptureOptions(parse_config({"profile": profile}).profile))
    with torch.no_grad():
        rec.run(lambda: model(*inputs))
    return rec


def targets(rec, kind="op"):
    return sorted({b.target for b in rec.buckets.values() if b.kind == kind})


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, fast_cfg):
    out = {}
    for name in TINY:
        store = TensorStore(tmp_path_factory.mktemp(name))
        out[name] = (profile_workload(load_workload(f"example:{name}"), "cpu", None, fast_cfg, store), store)
    return out


def test_op_cards_of_mlp(profiled):
    result, _ = profiled["tiny_mlp"]
    names = {c.target for c in result.cards}
    assert {"aten._softmax.default", "aten.native_layer_norm.default", "aten.gelu.default",
            "aten.addmm.default", "aten.add.Tensor"} <= names
    assert not any(c.target == "aten.t.default" for c in result.cards)  # views skipped by default
    for c in result.cards:
        assert c.calls >= 1 and c.time_us > 0 and c.bytes > 0 and c.floor_us > 0
        assert c.headroom == pytest.approx(c.time_us / c.floor_us)
        assert c.share == pytest.approx(c.calls * c.time_us / result.forward.median)


def test_rmsnorm_is_one_module_card(profiled):
    result, _ = profiled["tiny_decoder"]
    rms = [c for c in result.cards if c.target == "module:RMSNorm"]
    assert len(rms) == 1
    card = rms[0]
    assert card.calls == 5  # 2 layers x 2 norms + final norm, all one signature
    ops = [n["op"] for n in card.program["nodes"]]
    assert ops == ["aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor",
                   "aten.rsqrt.default", "aten.mul.Tensor", "aten._to_copy.default", "aten.mul.Tensor"] or \
        {"aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.rsqrt.default", "aten.mul.Tensor"} <= set(ops)
    roles = [s.role for s in card.inputs]
    assert roles == ["input", "param"] and card.inputs[1].name == "weight"
    assert "layers.0.input_layernorm" in card.module_paths and "norm" in card.module_paths


def test_every_card_reference_reproduces_captured_outputs(profiled):
    """reference(captured inputs) == captured outputs, for every card of every bundled tiny example."""
    checked = 0
    for name, (result, store) in profiled.items():
        for card in result.cards:
            assert "reference_mismatch" not in card.flags, (name, card.id)
            for i in range(len(card.samples)):
                ins = sample_inputs(card, store, i, "cpu")
                got = run_program(card.program, ins, "cpu")
                want = sample_outputs(card, store, i, "cpu")
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert g.shape == w.shape and g.dtype == w.dtype, (name, card.id)
                    if "dynamic_shape" in card.flags or g.numel() == 0:
                        continue
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{name} {card.id}")
                checked += 1
    assert checked > 100


def test_samples_are_bounded(profiled):
    for result, _ in profiled.values():
        for card in result.cards:
            assert len(card.samples) <= 2


def test_examples_cover_the_paper_families(profiled):
    ops = {c.op_name for r, _ in profiled.values() for c in r.cards}
    for needed in ["_softmax", "native_group_norm", "native_layer_norm", "native_batch_norm", "silu", "gelu",
                   "max_pool2d_with_indices", "mean", "convolution", "index_add_", "topk"]:
        assert needed in ops, needed
    mods = {c.op_name for r, _ in profiled.values() for c in r.cards if c.kind == "module"}
    assert "RMSNorm" in mods and "RotaryEmbedding" in mods
    # one real op (plus an allocation), but in eval mode its saved statistics are scratch (CUDA
    # leaves them unwritten): the module, which returns the normalised output alone, is the card
    bn = [c for r, _ in profiled.values() for c in r.cards if c.target == "module:BatchNorm2d"]
    assert bn and all(c.program["outputs"] == [{"$node": 0, "out": 0}] and len(c.outputs) == 1 for c in bn)
    assert all([n["op"] for n in c.program["nodes"]] == ["aten.native_batch_norm.default"] for c in bn)
    # one op, but the module drops its indices (4x the bytes of the values): a card of its own;
    # norms drop only their small saved statistics, which makes no second card
    assert "MaxPool2d" in mods and "LayerNorm" not in mods


class WithRng(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        w = self.w.to(torch.float64).to(torch.float32)  # a parameter copy each forward
        noise = torch.randn_like(x)  # RNG
        return (x @ w).view(-1) + noise.view(-1)


def test_skip_rules_are_configurable():
    model, x = WithRng(), torch.randn(4, 8)
    default = targets(capture(model, [x]))
    assert "aten.randn_like.default" not in default and "aten.randn.default" not in default
    assert "aten.view.default" not in default
    assert "aten._to_copy.default" not in default  # parameter copy
    assert "aten.mm.default" in default
    everything = targets(capture(model, [x], skip_views=False, skip_rng=False, skip_param_copies=False))
    assert "aten.view.default" in everything
    assert "aten._to_copy.default" in everything
    assert any("rand" in t for t in everything)


def test_granularities_can_be_switched_off():
    w = load_workload("example:tiny_decoder")
    model, inputs = w.build("cpu")
    only_ops = capture(model, inputs, modules=False)
    assert targets(only_ops, "module") == []
    only_mods = capture(model, inputs, ops=False)
    assert targets(only_mods, "op") == [] and "module:RMSNorm" in targets(only_mods, "module")


def test_signature_distinguishes_strides_and_scalars():
    class M(torch.nn.Module):
        def forward(self, x):
            a = torch.softmax(x, -1)
            b = torch.softmax(x.t(), -1)  # same shape, other strides
            c = x * 2.0
            d = x * 3.0  # same shapes, other scalar
            return a, b, c, d

    rec = capture(M(), [torch.randn(6, 6)])
    softmax = [b for b in rec.buckets.values() if b.target == "aten._softmax.default"]
    muls = [b for b in rec.buckets.values() if b.target == "aten.mul.Tensor"]
    assert len(softmax) == 2 and len(muls) == 2


def test_inplace_op_card_is_functional():
    class M(torch.nn.Module):
        def forward(self, x, y):
            z = x * 1.5
            z.add_(y)
            return z

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    rec = capture(M(), [x, y])
    (b,) = [b for b in rec.buckets.values() if b.target == "aten.add_.Tensor"]
    assert "mutates" in b.flags
    from forge_tui.tensorstore import unpack

    ins = [unpack(*p) for p in b.samples[0][0]]
    before = ins[0].clone()
    out = run_program(b.program, ins)[0]
    torch.testing.assert_close(out, before + y)  # sample inputs were captured before the mutation


class ReadsAndWrites(torch.nn.Module):
    """Ops whose bytes are known by hand: x (8, 32) fp32 is 1024 bytes, y (32,) fp32 128 bytes."""

    class Scaled(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2.0, -1)  # two ops: a module card of its own

    def __init__(self):
        super().__init__()
        self.scaled = self.Scaled()

    def forward(self, x, y):
        return (torch.softmax(x, -1), x.sum(-1), torch.argmax(x, -1), y.expand(8, 32) * 3.0, self.scaled(x))


def test_a_cards_bytes_are_every_input_read_once_plus_every_output_written():
    """The roofline floor of a card is its bytes over the bandwidth: bytes must count what the
    outputs write as well as what the inputs read (an expanded input read once, at its storage)."""
    rec = capture(ReadsAndWrites(), [torch.randn(8, 32), torch.randn(32)])
    by = {}
    for b in rec.buckets.values():
        key = b.target if b.kind == "module" or b.target != "aten.mul.Tensor" else (b.target, tuple(b.inputs[0].stride))
        by[key] = b.bytes
    assert by["aten._softmax.default"] == 1024 + 1024      # fp32 in, fp32 out of the same size
    assert by["aten.sum.dim_IntList"] == 1024 + 8 * 4       # a reduction writes 8 floats
    assert by["aten.argmax.default"] == 1024 + 8 * 8        # and an argmax 8 int64
    assert by[("aten.mul.Tensor", (0, 1))] == 128 + 1024    # the expanded y: its 32 floats, read once
    assert by[("aten.mul.Tensor", (32, 1))] == 1024 + 1024
    assert by["module:Scaled"] == 1024 + 1024               # the module's own inputs and outputs, not its insides


def test_profiled_cards_carry_the_bytes_of_their_inputs_and_outputs(profiled):
    result, _ = profiled["kb_softmax"]
    card = next(c for c in result.cards if c.target == "aten._softmax.default")
    assert [s.shape for s in card.inputs] == [[16, 512]] and [s.shape for s in card.outputs] == [[16, 512]]
    assert card.bytes == 2 * 16 * 512 * 4


def test_a_card_timed_longer_than_the_whole_forward_is_flagged(tmp_path, fast_cfg, monkeypatch):
    """A card cannot take more than the forward: when a disturbed timing says it does (a busy
    machine once made one 1037% of the forward), the card is flagged and the profile warns."""
    from forge_tui.profiler import run as run_mod

    real = run_mod.QuietTimer.time

    def slow_softmax(self, name, fn, **kw):
        stats, noisy = real(self, name, fn, **kw)
        if name == "_softmax":
            stats = stats.__class__.from_samples([s * 0 + 1e6 for s in [stats.median] * 3])  # 1 s a call
        return stats, noisy

    monkeypatch.setattr(run_mod.QuietTimer, "time", slow_softmax)
    result = profile_workload(load_workload("example:kb_softmax"), "cpu", None, fast_cfg, TensorStore(tmp_path))
    sm = next(c for c in result.cards if c.target == "aten._softmax.default")
    assert sm.share > 1 and "share_over_forward" in sm.flags
    assert any(w.startswith(f"{sm.id}: timed at") and "more than all of it" in w for w in result.warnings)
    assert all("share_over_forward" not in c.flags for c in result.cards if c.share is not None and c.share <= 1)
