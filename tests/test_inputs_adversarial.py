"""Adversarial input sets (forge_tui/inputs.py): which cards get which sets, that every set keeps the
card's exact layouts and domains, and that real CPU candidates with the classic approximations
(softmax without the max, RMSNorm without eps, one-pass variance) pass ordinary random inputs
but fail the set aimed at them. Also fresh_inputs_into (in-place refills before timed runs)."""

from pathlib import Path

import pytest
import torch

from forge_tui.cards import Card, TensorSpec
from forge_tui.inputs import ADVERSARIAL_SETS, adversarial_inputs, card_kinds, fresh_inputs_into, random_inputs, random_tensor

HERE = Path(__file__).parent
CPU = HERE / "candidates" / "cpu"
WORKLOADS = HERE / "data" / "workloads"


def make_card(ops, inputs=None, outputs=None) -> Card:
    inputs = inputs or [TensorSpec(shape=[8, 64], stride=[64, 1], dtype="float32")]
    outputs = outputs or [TensorSpec(shape=[8, 64], stride=[64, 1], dtype="float32", role="output")]
    nodes = [{"op": op, "args": [{"$in": 0}]} for op in ops]
    return Card(id="t", kind="op", target=ops[0] if ops else "x", label="t", inputs=inputs, outputs=outputs,
                program={"nodes": nodes, "outputs": [{"$node": len(nodes) - 1, "out": 0}]})


# ---- classification ----------------------------------------------------------------------------

@pytest.mark.parametrize("ops, kinds", [
    (["aten._softmax.default"], {"exp"}),
    (["aten._log_softmax.default"], {"exp"}),
    (["aten._safe_softmax.default"], {"exp"}),
    (["aten.silu.default", "aten.mul.Tensor"], {"exp"}),
    (["aten.gelu.default"], {"exp"}),
    (["aten.exp_.default"], {"exp"}),
    (["aten.native_layer_norm.default"], {"norm"}),
    (["aten._native_batch_norm_legit_no_training.default"], {"norm"}),
    (["aten.native_group_norm.default"], {"norm"}),
    (["aten.var_mean.correction"], {"norm"}),
    (["aten.linalg_vector_norm.default"], {"norm"}),
    (["aten._fused_rms_norm.default"], {"norm"}),
    # a Hugging Face RMSNorm as a module card
    (["aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.rsqrt.default", "aten.mul.Tensor",
      "aten.mul.Tensor"], {"norm"}),
    (["aten.mul.Tensor", "aten.mean.dim"], {"norm"}),
    (["aten.mean.dim"], set()),                   # a plain mean divides by a count, not a statistic
    (["aten.add.Tensor", "aten.mul.Tensor"], set()),
    (["aten.mm.default"], set()),
    (["aten._softmax.default", "aten.native_layer_norm.default"], {"exp", "norm"}),
])
def test_card_kinds(ops, kinds):
    assert card_kinds(make_card(ops)) == kinds


# ---- the sets ----------------------------------------------------------------------------------

SPECS = [
    TensorSpec(shape=[8, 64], stride=[64, 1], dtype="float32", name="x"),
    TensorSpec(shape=[16, 4], stride=[1, 16], dtype="float16", name="xt"),              # transposed
    TensorSpec(shape=[6, 32], stride=[0, 1], dtype="bfloat16", name="xe"),              # expanded rows
    TensorSpec(shape=[8, 64], stride=[64, 1], dtype="float32", name="var", value_range=(0.0, 5.0)),
    TensorSpec(shape=[4, 8], stride=[16, 2], dtype="float32", name="gappy"),            # slice with gaps
    TensorSpec(shape=[64], stride=[1], dtype="float32", role="param", name="w", value_range=(0.9, 1.1)),
    TensorSpec(shape=[5], stride=[1], dtype="int64", name="idx", value_range=(0, 7)),
    TensorSpec(shape=[3], stride=[1], dtype="bool", name="mask"),
]
FLOAT_INPUTS = [0, 1, 2, 3, 4]
BOTH = make_card(["aten._softmax.default", "aten.native_layer_norm.default"], inputs=SPECS)


@pytest.fixture(scope="module")
def sets():
    return dict(adversarial_inputs(BOTH, "cpu", seed=3))


def test_sets_by_kind():
    assert [n for n, _ in adversarial_inputs(BOTH, "cpu", 0)] == list(ADVERSARIAL_SETS)
    assert [n for n, _ in adversarial_inputs(make_card(["aten._softmax.default"]), "cpu", 0)] == ["overflow", "special"]
    assert [n for n, _ in adversarial_inputs(make_card(["aten.native_layer_norm.default"]), "cpu", 0)] == [
        "zeros", "tiny", "offset", "special"]
    assert [n for n, _ in adversarial_inputs(make_card(["aten.add.Tensor"]), "cpu", 0)] == ["special"]
    ints = [TensorSpec(shape=[4], stride=[1], dtype="int64")]
    assert adversarial_inputs(make_card(["aten._softmax.default"], inputs=ints), "cpu", 0) == []
    params_only = [TensorSpec(shape=[4], stride=[1], dtype="float32", role="param")]
    assert adversarial_inputs(make_card(["aten.native_layer_norm.default"], inputs=params_only), "cpu", 0) == []


def test_every_set_has_the_exact_layouts(sets):
    for name, tensors in sets.items():
        assert len(tensors) == len(SPECS)
        for t, s in zip(tensors, SPECS):
            assert list(t.shape) == s.shape and list(t.stride()) == s.stride, (name, s.name)
            assert t.dtype == getattr(torch, s.dtype) and t.device.type == "cpu", (name, s.name)


def test_overflow_makes_exp_overflow_on_finite_inputs(sets):
    for i in FLOAT_INPUTS:
        x = sets["overflow"][i]
        assert bool(torch.isfinite(x).all()), SPECS[i].name
        assert bool(torch.isinf(torch.exp(x.float())).any()), SPECS[i].name
        assert float(x.float().abs().max()) < 100  # near the overflow, not beyond representable ranges
    x = sets["overflow"][0]
    assert bool((x < -85).any()) and bool((x > 88.8).any())
    # rows of a max-subtracting softmax stay finite: the reference is well defined
    assert bool(torch.isfinite(torch.softmax(x, -1)).all())
    with torch.no_grad():
        naive = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    assert not bool(torch.isfinite(naive).all())


def test_zeros_has_whole_zero_rows(sets):
    x = sets["zeros"][0]
    zero_rows = (x == 0).all(-1)
    assert zero_rows[:4].all() and not zero_rows[4:].any()     # the first half, in row-major order
    assert bool((x.reshape(-1)[:x.numel() // 2] == 0).all())
    xt = sets["zeros"][1]                                      # transposed layout: logical order counts
    assert bool((xt[:8] == 0).all()) and not bool((xt[8:] == 0).all())
    for i in FLOAT_INPUTS:
        assert not bool((sets["zeros"][i] == 0).all()) or SPECS[i].name == "xe"


def test_tiny_squares_are_far_below_any_eps(sets):
    x = sets["tiny"][0]
    assert bool((x != 0).all()) and float((x * x).max()) < 1e-20
    h = sets["tiny"][1]                                        # fp16: representable, squares below 1e-6
    assert bool((h != 0).all()) and bool(torch.isfinite(h).all())
    assert float((h.float() ** 2).max()) < 1e-6
    b = sets["tiny"][2]                                        # bf16 keeps fp32's exponent range
    assert bool((b != 0).all()) and float((b.float() ** 2).max()) < 1e-20


def test_offset_rows_have_a_large_mean_and_unit_spread(sets):
    x = sets["offset"][0]
    mean, std = x.mean(-1), x.std(-1)
    assert bool((mean.abs() > 8).all()) and bool((std > 0.5).all()) and bool((std < 2).all())
    # one sign for the whole tensor: a group or column mean over both signs would cancel, and
    # eager's own mean would be as uncertain as any kernel's
    assert bool((mean > 0).all()) or bool((mean < 0).all())
    # a one-pass fp32 variance is far off, a two-pass one is not
    one_pass = (x * x).mean(-1) - mean * mean
    two_pass = ((x - mean[:, None]) ** 2).mean(-1)
    exact = x.double().var(-1, unbiased=False)
    assert float(((two_pass.double() - exact) / exact).abs().max()) < 1e-5
    assert float(((one_pass.double() - exact) / exact).abs().max()) > 1e-5


def test_special_has_nan_and_infs_but_is_mostly_finite(sets):
    for i in FLOAT_INPUTS:
        x = sets["special"][i].float()
        fin = torch.isfinite(x)
        if SPECS[i].name == "xe":          # expanded: the planted storage reaches many elements, but not all
            assert 0 < int((~fin).sum()) < x.numel()
            continue
        assert 0.9 < float(fin.float().mean()) < 1.0, SPECS[i].name
        assert bool(torch.isnan(x).any()) and bool((x == float("inf")).any()), SPECS[i].name
    x = sets["special"][0]
    assert bool((x == float("-inf")).any())
    bad_rows = (~torch.isfinite(x)).any(-1).nonzero().flatten().tolist()
    assert len(bad_rows) == 3                                  # in different rows
    var = sets["special"][3]
    assert not bool((var == float("-inf")).any())              # non-negative: NaN and +inf only


def test_non_negative_inputs_stay_non_negative(sets):
    for name, tensors in sets.items():
        v = tensors[3]
        assert bool((v[~torch.isnan(v)] >= 0).all()), name


def test_params_ints_and_bools_get_ordinary_values(sets):
    for name, tensors in sets.items():
        w, idx, mask = tensors[5], tensors[6], tensors[7]
        assert bool(((w >= 0.9) & (w <= 1.1)).all()), name
        assert bool(((idx >= 0) & (idx <= 7)).all()), name
        assert mask.dtype == torch.bool


def _same(a, b) -> bool:
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8) if a.is_floating_point() else a,
                                              b.contiguous().view(torch.uint8) if b.is_floating_point() else b)


def test_deterministic_by_seed():
    a, b, c = (adversarial_inputs(BOTH, "cpu", seed=s) for s in (5, 5, 6))
    for (na, ta), (nb, tb), (nc, tc) in zip(a, b, c):
        assert na == nb == nc
        assert all(_same(x, y) for x, y in zip(ta, tb)), na
        assert not all(_same(x, y) for x, y in zip(ta, tc)), na


def test_small_and_scalar_tensors_are_never_all_special():
    specs = [TensorSpec(shape=[], stride=[], dtype="float32"), TensorSpec(shape=[2], stride=[1], dtype="float32"),
             TensorSpec(shape=[1, 1], stride=[1, 1], dtype="float16")]
    card = make_card(["aten._softmax.default", "aten.rsqrt.default"], specs)
    for name, tensors in adversarial_inputs(card, "cpu", 0):
        for t, s in zip(tensors, specs):
            assert list(t.shape) == s.shape
            assert bool(torch.isfinite(t).any()), (name, s)


# ---- fresh contents in place -------------------------------------------------------------------

def test_fresh_inputs_into_writes_in_place_into_views():
    buf = torch.zeros(4096)
    strided = buf[:1024].view(32, 32)[:, ::2]                  # every other column: gaps stay untouched
    expanded = buf[2048:2080].expand(8, 32)                    # stride 0: the 32 elements it reaches
    nonneg = buf[3000:3064].view(8, 8)
    idx = torch.zeros(6, dtype=torch.int64)
    specs = [TensorSpec(shape=list(strided.shape), stride=list(strided.stride()), dtype="float32"),
             TensorSpec(shape=[8, 32], stride=[0, 1], dtype="float32"),
             TensorSpec(shape=[8, 8], stride=[8, 1], dtype="float32", value_range=(0.0, 3.0)),
             TensorSpec(shape=[6], stride=[1], dtype="int64", value_range=(2, 5))]
    card = make_card(["aten.add.Tensor"], inputs=specs)
    tensors = [strided, expanded, nonneg, idx]
    ptrs = [t.data_ptr() for t in tensors]
    gen = torch.Generator().manual_seed(0)
    fresh_inputs_into(card, tensors, gen, draw=0)
    assert [t.data_ptr() for t in tensors] == ptrs
    assert bool((strided != 0).all()) and bool((buf[:1024].view(32, 32)[:, 1::2] == 0).all())
    assert bool((buf[2048:2080] != 0).all()) and bool((expanded == expanded[0]).all())
    assert bool((buf[2080:3000] == 0).all()) and bool((buf[3064:] == 0).all())
    assert bool((nonneg >= 0).all()) and bool(((idx >= 2) & (idx <= 5)).all())
    before = [t.clone() for t in tensors]
    fresh_inputs_into(card, tensors, gen, draw=1)                # new contents on each call
    assert all(not torch.equal(a, b) for a, b in zip(before[:3], tensors[:3]))


def test_fresh_inputs_into_draws_as_random_tensor():
    specs = [TensorSpec(shape=[4, 16], stride=[16, 1], dtype="float16"),
             TensorSpec(shape=[16], stride=[1], dtype="float32", role="param", value_range=(0.5, 1.5))]
    card = make_card(["aten.add.Tensor"], inputs=specs)
    for draw in range(5):
        expected = [random_tensor(s, "cpu", g, draw) for g in [torch.Generator().manual_seed(9)] for s in specs]
        tensors = [torch.empty(4, 16, dtype=torch.float16), torch.empty(16)]
        fresh_inputs_into(card, tensors, torch.Generator().manual_seed(9), draw)
        assert all(torch.equal(a, b) for a, b in zip(expected, tensors)), draw


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_fresh_inputs_into_generates_on_the_device():
    specs = [TensorSpec(shape=[64, 128], stride=[128, 1], dtype="bfloat16"),
             TensorSpec(shape=[64, 128], stride=[0, 1], dtype="float32", value_range=(0.0, 2.0))]
    card = make_card(["aten.add.Tensor"], inputs=specs)
    tensors = [torch.zeros(64, 128, dtype=torch.bfloat16, device="cuda"),
               torch.zeros(128, device="cuda").expand(64, 128)]
    fresh_inputs_into(card, tensors, torch.Generator(device="cuda").manual_seed(1), draw=0)
    assert bool((tensors[0] != 0).any()) and bool((tensors[1] >= 0).all()) and bool((tensors[1] != 0).any())
    fresh_inputs_into(card, tensors, torch.Generator().manual_seed(1), draw=1)   # a CPU generator also works


# ---- real candidates that the sets must reject -------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from forge_tui.evaluator.build import Builder
    from forge_tui.kernel_abi import Library

    root = tmp_path_factory.mktemp("advbuild")
    builder = Builder("cpu", root / "build")
    if not builder.available():
        pytest.skip("no C++ compiler")
    libs = {}

    def get(filename):
        if filename not in libs:
            r = builder.build((CPU / filename).read_text())
            assert r.ok, r.log
            libs[filename] = Library(r.library)
        return libs[filename]

    yield get
    builder.close()


@pytest.fixture(scope="module")
def workload_cards(tmp_path_factory):
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("advws")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\n")
    out = {}
    for name, spec, target in [("softmax", "example:kb_softmax", "aten._softmax.default"),
                               ("rmsnorm", WORKLOADS / "rmsnorm.py", "module:RMSNorm"),
                               ("layernorm", WORKLOADS / "layernorm.py", "aten.native_layer_norm.default")]:
        ws, _ = profile_into_workspace(spec, root / name, device="cpu", config_path=cfg)
        out[name] = next(c for c in ws.cards() if c.target == target)
    return out


def _verdicts(lib, card, seed=11) -> dict:
    """{set name: None if the candidate matches the reference, else the mismatch} on random sets
    (draws 0-2, as the evaluator's default sets) and the adversarial sets."""
    from forge_tui.compare import compare
    from forge_tui.kernel_abi import card_scalars
    from forge_tui.program import run_program

    scalars = card_scalars(card.program)
    sets = [(f"random-{d}", random_inputs(card, "cpu", seed=seed + d, draw=d)) for d in range(3)]
    sets += adversarial_inputs(card, "cpu", seed=seed)
    out = {}
    for name, ins in sets:
        expected = [o.clone() for o in run_program(card.program, [t.clone() for t in ins], "cpu")]
        outs = [torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype)) for s in card.outputs]
        assert lib.bind(ins, outs, scalars, None)() == 0, name
        bad = None
        for k, (o, e) in enumerate(zip(outs, expected)):
            fin = e.double()[torch.isfinite(e)]
            rms = float(fin.pow(2).mean().sqrt()) if fin.numel() else 1.0
            bad = bad or compare(o, e, k, scale=rms)
        out[name] = bad
    return out


def _failing(verdicts: dict) -> set:
    return {k for k, v in verdicts.items() if v is not None}


def test_softmax_without_max_fails_only_the_overflow_and_special_sets(built, workload_cards):
    card = workload_cards["softmax"]
    assert card_kinds(card) == {"exp"}
    assert _failing(_verdicts(built("softmax_good.cpp"), card)) == set()
    bad = _verdicts(built("softmax_no_max.cpp"), card)
    assert "overflow" in _failing(bad) and not _failing(bad) & {"random-0", "random-1", "random-2"}
    assert "NaN" in str(bad["overflow"])


def test_rmsnorm_without_eps_fails_on_zero_and_tiny_rows(built, workload_cards):
    card = workload_cards["rmsnorm"]
    assert card_kinds(card) == {"norm"}
    assert [s.role for s in card.inputs] == ["input", "param"]   # activation, then weight
    assert _failing(_verdicts(built("rmsnorm_good.cpp"), card)) == set()
    assert _failing(_verdicts(built("rmsnorm_no_eps.cpp"), card)) == {"zeros", "tiny"}


def test_one_pass_variance_fails_on_the_offset_set(built, workload_cards):
    card = workload_cards["layernorm"]
    naive = _verdicts(built("layernorm_naive_var.cpp"), card)
    assert "offset" in _failing(naive) and not _failing(naive) & {"random-0", "random-1", "random-2", "zeros", "tiny"}
    honest = _verdicts(built("layernorm_twopass.cpp"), card)
    assert not _failing(honest) & {"random-0", "random-1", "random-2", "zeros", "tiny", "offset"}
