import json

import pytest

from forge_tui import roofline
from forge_tui.timing import Stats, Timer, paired_ratio


def test_stats():
    s = Stats.from_samples([4.0, 1.0, 3.0, 2.0, 5.0])
    assert s.median == 3.0 and s.min == 1.0 and s.max == 5.0 and s.n == 5
    assert s.q1 == 2.0 and s.q3 == 4.0 and s.spread == pytest.approx(2 / 3)
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 2.0]).median == 2.0


def test_interleaved_order_and_counts():
    order = []
    timer = Timer("cpu", warmup=1, repeats=4)
    stats, raw, overhead = timer.time({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                      after_each=lambda name, i: order.append(f"check-{name}{i}"))
    assert order[:2] == ["a", "b"]  # warm-up
    assert order[2:8] == ["a", "check-a0", "b", "check-b0", "a", "check-a1"]
    assert len(raw["a"]) == len(raw["b"]) == 4 and stats["a"].n == 4
    assert overhead == 0.0  # only CUDA measures the synchronisation overhead


def test_ceilings_measured_once_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(device):
        calls.append(device)
        return {"bandwidth_Bps": 1e10, "peak_flops": {"float32": 1e11}, "device_name": "fake"}

    monkeypatch.setattr(roofline, "measure", fake_measure)
    a = roofline.ceilings("cpu")
    b = roofline.ceilings("cpu")
    assert a == b and calls == ["cpu"]
    assert json.loads((tmp_path / "ceilings.json").read_text())["devices"]
    # floor = max(bytes / bandwidth, flops / peak)
    assert roofline.floor_us(10**10, 0, "float32", a) == pytest.approx(1e6)
    assert roofline.floor_us(0, 10**11, "bfloat16", a) == pytest.approx(1e6)  # falls back to fp32 peak


def test_real_cpu_ceilings_are_plausible():
    c = roofline.ceilings("cpu")
    assert 1e8 < c["bandwidth_Bps"] < 1e13
    assert 1e8 < c["peak_flops"]["float32"] < 1e14
