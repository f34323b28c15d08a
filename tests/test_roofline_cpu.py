"""The CPU roofline floor is cache-aware: a bandwidth curve over buffer sizes, and a card's floor
uses the fastest level its bytes could sit in (forge_tui/roofline.py)."""

import json

import pytest

from forge_tui import roofline

KIB, MIB = 1 << 10, 1 << 20
SYNTHETIC = {
    "bandwidth_Bps": 1e10,  # DRAM, for display
    "bandwidth_curve": [[16 * KIB, 2e11], [256 * KIB, 1.5e11], [4 * MIB, 1e11], [64 * MIB, 2e10],
                        [256 * MIB, 1e10]],
    "peak_flops": {"float32": 1e12},
    "device_name": "synthetic",
}


def test_small_card_uses_the_fast_level_and_large_card_dram():
    # 64 KiB moved: its 32 KiB "buffer" fits the 256 KiB level, and every level above it: best 1.5e11
    assert roofline.floor_us(64 * KIB, 0, "float32", SYNTHETIC) == pytest.approx(64 * KIB / 1.5e11 * 1e6)
    # 16 KiB moved fits the smallest (fastest) level
    assert roofline.floor_us(16 * KIB, 0, "float32", SYNTHETIC) == pytest.approx(16 * KIB / 2e11 * 1e6)
    # 100 MiB moved: 50 MiB buffers, only the 64 MiB and 256 MiB levels hold them
    assert roofline.floor_us(100 * MIB, 0, "float32", SYNTHETIC) == pytest.approx(100 * MIB / 2e10 * 1e6)
    # 1 GiB moved: larger than any measured buffer: DRAM
    assert roofline.floor_us(1 << 30, 0, "float32", SYNTHETIC) == pytest.approx((1 << 30) / 1e10 * 1e6)
    # the compute bound still applies
    assert roofline.floor_us(16 * KIB, 10**9, "float32", SYNTHETIC) == pytest.approx(1e3)


def test_floor_never_grows_when_the_card_shrinks():
    sizes = [2**k for k in range(10, 32)]
    floors_per_byte = [roofline.floor_us(b, 0, "float32", SYNTHETIC) / b for b in sizes]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(floors_per_byte, floors_per_byte[1:]))


def test_a_dip_in_the_curve_does_not_raise_the_floor():
    """A level measured slow (a loaded moment) is covered by any faster larger level."""
    dip = dict(SYNTHETIC, bandwidth_curve=[[16 * KIB, 2e11], [256 * KIB, 1e9], [4 * MIB, 1e11],
                                           [256 * MIB, 1e10]])
    assert roofline.bandwidth_for(300 * KIB, dip) == 1e11
    assert roofline.bandwidth_for(300 * KIB, dip) == roofline.bandwidth_for(8 * MIB, dip)


def test_a_ceiling_without_a_curve_uses_its_bandwidth():
    cuda_like = {"bandwidth_Bps": 4e12, "peak_flops": {"float32": 5e13}}
    assert roofline.floor_us(4 * 10**6, 0, "float32", cuda_like) == pytest.approx(1.0)
    assert roofline.bandwidth_for(16 * KIB, cuda_like) == 4e12


def test_measured_curve_is_faster_in_cache_than_in_dram():
    c = roofline.copy_curve(sizes=(32 * KIB, 1 * MIB, 64 * MIB), trials=5)
    curve = c["curve"]
    assert [s for s, _ in curve] == [32 * KIB, 1 * MIB, 64 * MIB]
    assert all(b > 1e8 for _, b in curve)
    assert curve[0][1] >= curve[-1][1], curve
    assert 0 < c["call_overhead_s"] < 1e-3


def test_cpu_ceilings_carry_the_curve():
    c = roofline.ceilings("cpu")
    sizes = [s for s, _ in c["bandwidth_curve"]]
    assert sizes == sorted(sizes) and sizes[0] <= 16 * KIB and sizes[-1] >= 256 * MIB
    assert c["bandwidth_Bps"] == c["bandwidth_curve"][-1][1]  # DRAM stays the displayed figure
    assert roofline.bandwidth_for(32 * KIB, c) >= c["bandwidth_Bps"]


def test_previous_cache_version_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path))
    key = roofline.device_key("cpu")
    old = {"version": 1, "devices": {key: {"bandwidth_Bps": 1.0, "peak_flops": {"float32": 1.0},
                                           "device_name": "old"}}}
    (tmp_path / "ceilings.json").write_text(json.dumps(old))
    calls = []

    def fake_measure(device):
        calls.append(device)
        return dict(SYNTHETIC, device_name="new")

    monkeypatch.setattr(roofline, "measure", fake_measure)
    c = roofline.ceilings("cpu")
    assert calls == ["cpu"] and c["device_name"] == "new" and c["bandwidth_curve"]
    saved = json.loads((tmp_path / "ceilings.json").read_text())
    assert saved["version"] == roofline.CACHE_VERSION > 1
    assert saved["devices"][key]["device_name"] == "new"
    assert roofline.ceilings("cpu") == c and calls == ["cpu"]  # cached from now on


NO_BF16 = {  # a CPU without half-precision arithmetic: torch's bf16 and fp16 products crawl
    "bandwidth_Bps": 6e9, "bandwidth_curve": [[16 * KIB, 4e10], [256 * MIB, 6e9]],
    "peak_flops": {"float32": 2.4e10, "bfloat16": 1e9, "float16": 1e9}, "device_name": "synthetic",
}


def test_a_half_precision_card_gets_float32s_peak_where_that_is_higher():
    """An elementwise bf16 card's compute bound from a 1 GFLOP/s bf16 peak (245 µs for 245k flops)
    is longer than eager's own time on such a CPU: a kernel computes in fp32 and rounds once."""
    flops = 245_000
    assert roofline.peak_for("bfloat16", NO_BF16) == 2.4e10
    assert roofline.floor_terms(0, flops, "bfloat16", NO_BF16)[1] == pytest.approx(flops / 2.4e10 * 1e6)
    fast_bf16 = dict(NO_BF16, peak_flops={"float32": 2.4e10, "bfloat16": 9e10})  # AVX512-BF16, or a GPU
    assert roofline.peak_for("bfloat16", fast_bf16) == 9e10


def test_a_bound_eager_itself_beats_is_left_out_of_the_floor():
    """The floor the judge applies is never above eager's own fastest call: a bound from a ceiling
    eager beats is dropped, and the other bound stands."""
    mem, comp = roofline.floor_terms(1 << 20, 10**9, "float32", NO_BF16)
    assert comp > mem
    assert roofline.floor_under(comp * 2, 1 << 20, 10**9, "float32", NO_BF16) == comp   # eager slower: both stand
    assert roofline.floor_under(comp / 2, 1 << 20, 10**9, "float32", NO_BF16) == mem    # eager beats the compute bound
    assert roofline.floor_under(mem / 2, 1 << 20, 10**9, "float32", NO_BF16) == 0.0     # and the memory bound
    for eager in (mem / 3, mem, comp / 2, comp * 5):
        assert roofline.floor_under(eager, 1 << 20, 10**9, "float32", NO_BF16) <= eager
