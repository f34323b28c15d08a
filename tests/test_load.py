"""Timing on a loaded machine: with two busy processes on the machine, a measurement is either as
good as the quiet one (within 20%) or says it is not trustworthy. Never a confident wrong number.

These tests use the default quietness thresholds (the other tests loosen them, since CI runs two
test processes side by side)."""

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from forge_tui.config import parse_config
from forge_tui.evaluator import Evaluator
from forge_tui.workspace import profile_into_workspace

pytestmark = pytest.mark.slow
CPU_GOOD = "tests/candidates/cpu/softmax_good.cpp"


@contextmanager
def busy(n: int = 2):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def softmax_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 5\n")
    ws, _ = profile_into_workspace("example:kb_softmax", root / "ws", device="cpu", config_path=cfg)
    return ws, next(c for c in ws.cards() if c.target == "aten._softmax.default")


def test_an_honest_speedup_under_load_is_close_to_the_quiet_one_or_noisy(softmax_ws):
    from pathlib import Path

    ws, card = softmax_ws
    src = (Path(__file__).parent.parent / CPU_GOOD).read_text()
    cfg = parse_config({"timing": {"warmup": 1, "repeats": 6}})
    with Evaluator(ws.store, ws.cache, cfg, backend="cpu") as ev:
        quiet = [ev.evaluate(card, src) for _ in range(2)]
        with busy(2):
            loaded = ev.evaluate(card, src)
    for r in quiet + [loaded]:
        assert r.status in {"passed", "noisy"}, r.reason
    if loaded.status == "noisy":
        assert loaded.speedup_vs_eager is None and loaded.timing.noisy_reasons
        assert "busy" in loaded.reason or "spread" in loaded.reason
        return
    # trusted under load: it must agree with the quiet measurement (the raw one, should the quiet
    # runs themselves have been disturbed by the other test process)
    ref = [r.timing.speedup_vs_eager.median for r in quiet]
    ref = max(ref, key=lambda x: -abs(x - loaded.speedup_vs_eager))
    got = loaded.speedup_vs_eager
    assert abs(got / ref - 1) <= 0.2, (got, ref, loaded.timing.attempts)


def test_a_profile_under_load_warns_instead_of_reporting_a_confident_number(tmp_path):
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 6\n")
    _, before = profile_into_workspace("example:kb_softmax", tmp_path / "before", device="cpu", config_path=cfg)
    with busy(2):
        _, loaded = profile_into_workspace("example:kb_softmax", tmp_path / "loaded", device="cpu", config_path=cfg)
    if loaded.forward_noisy:
        assert any("not trustworthy" in w for w in loaded.warnings)
        return
    # trusted under load: not inflated by it, at most 20% above the fastest quiet profile of one
    # before and up to four after. Load makes a forward slower, never faster: a loaded profile
    # faster than the quiet ones says that CI's other test process disturbed those (once all five
    # read 8.5-11.3 µs where the loaded one read 6.3; earlier two read 15.4 and 18.9 against 10.8)
    quiet = [before]
    while loaded.forward.median > 1.2 * min(x.forward.median for x in quiet) and len(quiet) < 5:
        _, q = profile_into_workspace("example:kb_softmax", tmp_path / f"after{len(quiet)}", device="cpu",
                                      config_path=cfg)
        quiet.append(q)
    fastest = min(x.forward.median for x in quiet)
    assert fastest / 2 <= loaded.forward.median <= 1.2 * fastest, (loaded.forward.median, [x.forward.median for x in quiet])


def test_a_profile_counts_the_threads_waiting_for_a_cpu(tmp_path, monkeypatch):
    """The forward's time is not trusted while more threads are ready to run than there are CPUs
    by more than the tolerated slowdown (a load the calibration workload can miss); at or under
    it, that check says nothing. The count is a stand-in: nothing depends on this machine's load."""
    from forge_tui.profiler import run as run_mod
    from forge_tui.quiet import oversubscription

    assert oversubscription() is None or oversubscription() > 0
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nmax_spread = 10.0\nnoisy_retries = 0\n")
    monkeypatch.setattr(run_mod, "oversubscription", lambda: 2.0)
    _, busy_result = profile_into_workspace("example:kb_softmax", tmp_path / "busy", device="cpu", config_path=cfg)
    assert any("2.0x as many threads ready to run as CPUs" in r for r in busy_result.forward_noisy)
    assert any("not trustworthy" in w for w in busy_result.warnings)
    monkeypatch.setattr(run_mod, "oversubscription", lambda: 1.5)
    _, calm = profile_into_workspace("example:kb_softmax", tmp_path / "calm", device="cpu", config_path=cfg)
    assert not any("threads ready to run" in r for r in calm.forward_noisy)
