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
    # interleaved: every round runs each variant once, checked right after
    rounds = [order[2 + 4 * i: 6 + 4 * i] for i in range(4)]
    for i, r in enumerate(rounds):
        assert sorted(r[0::2]) == ["a", "b"] and r[1::2] == [f"check-{r[0]}{i}", f"check-{r[2]}{i}"]
    assert len(raw["a"]) == len(raw["b"]) == 4 and stats["a"].n == 4
    assert overhead == 0.0  # only CUDA measures the synchronisation overhead


def test_no_variant_keeps_its_place_or_its_predecessor():
    """Which variant a sample follows is spread evenly: in a fixed order, or one rotated a place a
    round, a variant nearly always followed the same one, and the H200 measured that bias."""
    from collections import Counter

    seq = []
    names = ["eager", "eager+forge", "compile", "compile+forge", "__empty__"]
    Timer("cpu", warmup=0, repeats=100).time({n: (lambda n=n: seq.append(n)) for n in names})
    first = Counter(seq[i] for i in range(0, len(seq), len(names)))
    assert max(first.values()) <= 35  # of 100 rounds; a fixed order puts one first in all
    after = Counter(zip(seq, seq[1:]))
    for a in names:
        for b in names:
            if a != b:
                assert after[(a, b)] >= 10, (a, b, after[(a, b)])  # of ~125 expected 25 each
        assert max(after[(b, a)] for b in names if b != a) <= 45
    # at the bench's 20 rounds, every two variants run in each order in exactly half the rounds
    seq.clear()
    Timer("cpu", warmup=0, repeats=20).time({n: (lambda n=n: seq.append(n)) for n in names})
    rounds = [seq[i:i + len(names)] for i in range(0, len(seq), len(names))]
    for a in names:
        for b in names:
            if a != b:
                assert sum(r.index(a) < r.index(b) for r in rounds) == 10, (a, b)


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


def test_speedups_are_medians_of_paired_ratios_not_ratios_of_medians():
    """Run i of the baseline over run i of the candidate: drift that hits both alike cancels. Here
    the per-run ratios are 10, 2 and 3 (median 3); the ratio of the medians would be 20/10 = 2."""
    r = paired_ratio([10.0, 20.0, 30.0], [1.0, 10.0, 10.0])
    assert r.median == 3.0 and r.n == 3 and r.min == 2.0 and r.max == 10.0
    assert paired_ratio([1.0, 2.0], [0.0, 1.0]).n == 1  # a zero time gives no ratio, not inf


def test_quartiles_and_spread_on_known_samples():
    s = Stats.from_samples([10.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    assert (s.min, s.q1, s.median, s.q3, s.max) == (1.0, 3.0, 5.0, 7.0, 10.0)
    assert s.spread == pytest.approx(4 / 5) and s.mean == pytest.approx(46 / 9)
    one = Stats.from_samples([2.5])
    assert one.q1 == one.q3 == one.median == 2.5 and one.spread == 0.0


def test_a_spread_beyond_max_spread_or_the_resolution_is_a_reason():
    from forge_tui.quiet import spread_reason

    tight = Stats.from_samples([9.8, 10.0, 10.0, 10.2, 10.1])  # IQR 0.2 on 10: 2%
    wide = Stats.from_samples([5.0, 8.0, 10.0, 12.0, 15.0])    # IQR 4 on 10: 40%
    assert spread_reason("candidate", tight, 0.15, 0.0) is None
    assert "candidate's samples spread 40%" in spread_reason("candidate", wide, 0.15, 0.0)
    assert spread_reason("candidate", wide, 0.5, 0.0) is None      # within max_spread
    assert spread_reason("candidate", wide, 0.15, 2.5) is None     # within twice the timer's resolution
    assert spread_reason("candidate", wide, 0.15, 1.9) is not None


def test_eager_much_slower_than_its_profile_is_a_reason():
    from forge_tui.quiet import profile_reason

    assert profile_reason(33.0, 10.0, 0.0, 3.0) is None             # 3x + 5 µs of slack: 35
    assert "busier than when it was profiled" in profile_reason(36.0, 10.0, 0.0, 3.0)
    assert profile_reason(5.0, 10.0, 0.0, 3.0) is None              # faster is never a reason
    assert profile_reason(100.0, None, 0.0, 3.0) is None            # no profiled time: nothing to compare
    assert profile_reason(36.0, 10.0, 3.0, 3.0) is None             # slack = 3 x the resolution: 9 µs
