"""Parsing Nsight Compute's raw CSV (a real report, recorded on the H200 by bench/evaluator_bench.py)."""

from pathlib import Path

import pytest

from forge_tui.evaluator.ncu import parse_csv, summarise, unavailable

RAW = Path(__file__).parent / "data" / "ncu_raw_softmax_h200.csv"


def test_parse_recorded_report():
    kernels = parse_csv(RAW.read_text())
    assert len(kernels) == 1
    k = kernels[0]
    assert k["kernel"].startswith("softmax_rows")
    assert k["duration_ns"] == pytest.approx(130496, rel=1e-3)
    assert 0 < k["dram_pct"] < 100 and 0 < k["achieved_occupancy_pct"] <= 100
    assert k["registers_per_thread"] == 20 and k["block_size"] == 256
    s = summarise(kernels, floor_us=63.8, bandwidth_Bps=4.2e12)
    assert s["available"] and s["duration_us"] == pytest.approx(130.5, rel=1e-2)
    assert s["roofline_fraction"] == pytest.approx(63.8 / s["duration_us"])
    assert 0 < s["bandwidth_fraction"] < 1 and s["local_memory_bytes"] == 0


def test_unavailable_is_a_result_not_an_error():
    assert summarise([], 1.0, 1.0)["available"] is False
    assert unavailable("x")["reason"] == "profiler unavailable: x"
