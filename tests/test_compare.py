"""Output comparison (forge_tui/compare.py): each dtype's tolerance holds at its stated size, no looser
and no tighter, for the relative and the absolute part alike; NaN and ±inf exactly where the
reference has them."""

import pytest
import torch

from forge_tui.compare import compare, tolerance

# the tolerances the judge promises (compare.py's header): fp32 near 1e-5, half precision near 1e-2
STATED = {"float64": (1e-7, 1e-9), "float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (1.6e-2, 1.6e-2)}


def test_the_tolerances_are_the_stated_ones():
    for name, tol in STATED.items():
        assert tolerance(name) == tol
    assert tolerance("int64") == (0.0, 0.0)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_relative_tolerance_at_its_size(dtype):
    """Values of 100 with a scale of 1e-3 (the absolute part, atol x scale, is negligible): 0.5x the
    relative tolerance passes, 2x and 10x fail, on every element (in half precision 100 x (1 +
    factor x rtol) rounds to 100.5, 101, 102, 103, 110 or 116: on the same side of the line)."""
    rtol, _ = STATED[dtype]
    dt = getattr(torch, dtype)
    e = torch.full((64,), 100.0, dtype=dt)
    for factor, ok in ((0.5, True), (2.0, False), (10.0, False)):
        a = (torch.full((64,), 100.0, dtype=torch.float64) * (1 + factor * rtol)).to(dt)
        m = compare(a, e, scale=1e-3)
        assert (m is None) == ok, (dtype, factor, m)
        if not ok:
            assert m.bad_fraction == 1.0 and "outside tolerance" in m.reason


def test_fp32_relative_and_absolute_parts_each_at_1e_5():
    e = torch.full((256,), 1000.0)
    assert compare(e * (1 + 0.5e-5), e, scale=1.0) is None
    assert compare(e * (1 + 3e-5), e, scale=1.0) is not None
    assert compare(e * (1 + 1e-4), e, scale=1.0) is not None  # 10x: far out
    zero = torch.zeros(256)
    # reference 0 and scale 1: only the absolute part, atol x scale
    assert compare(zero + 0.5e-5, zero, scale=1.0) is None
    assert compare(zero + 2e-5, zero, scale=1.0) is not None
    # atol scales with the reference's typical size: 2e-5 is fine against a scale of 10 (atol 1e-4)
    assert compare(zero + 2e-5, zero, scale=10.0) is None
    assert compare(zero + 2e-4, zero, scale=10.0) is not None


def test_fp32_softmax_like_outputs_off_by_3e_4_relative_fail():
    """The near miss softmax_approx_rcp.cpp makes: every element 3e-4 (30x) off. Looser
    tolerances (1000x: 1e-2) would let it through; the real ones must not."""
    torch.manual_seed(0)
    e = torch.softmax(torch.randn(16, 512), -1)
    rms = float(e.double().pow(2).mean().sqrt())
    m = compare(e * (1 + 3e-4), e, scale=rms)
    assert m is not None and m.bad_fraction > 0.5
    assert compare(e * (1 + 3e-6), e, scale=rms) is None


def test_nan_and_inf_exactly_where_the_reference_has_them():
    e = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare(e.clone(), e) is None
    assert compare(torch.tensor([1.0, 0.0, float("inf"), -float("inf")]), e) is not None  # NaN lost
    assert compare(torch.tensor([float("nan"), float("nan"), float("inf"), -float("inf")]), e) is not None
    assert compare(torch.tensor([1.0, float("nan"), -float("inf"), -float("inf")]), e) is not None  # sign
    # "position": which non-finite value does not matter, where does
    assert compare(torch.tensor([1.0, float("inf"), float("nan"), float("nan")]), e, nonfinite="position") is None
    assert compare(torch.tensor([1.0, 5.0, float("nan"), float("nan")]), e, nonfinite="position") is not None
    assert compare(torch.tensor([float("nan"), float("nan"), float("nan"), float("nan")]), e,
                   nonfinite="position") is not None


def test_integers_shapes_and_dtypes_are_exact():
    e = torch.arange(10)
    assert compare(e.clone(), e) is None
    off = e.clone()
    off[3] += 1
    m = compare(off, e)
    assert m is not None and m.bad_fraction == pytest.approx(0.1)
    assert compare(e.float(), e) is not None and compare(e[:9], e) is not None
