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
    # trusted under load: within 20% of a quiet profile, the closest of one before and up to four
    # after (CI's other test process can disturb the quiet ones too: once both of two read 15.4 and
    # 18.9 µs where the loaded one read 10.8)
    quiet = [before]
    ratio = loaded.forward.median / before.forward.median
    while not 1 / 1.2 <= ratio <= 1.2 and len(quiet) < 5:
        _, q = profile_into_workspace("example:kb_softmax", tmp_path / f"after{len(quiet)}", device="cpu",
                                      config_path=cfg)
        quiet.append(q)
        ratio = min((loaded.forward.median / x.forward.median for x in quiet), key=lambda r: abs(r - 1))
    assert 1 / 1.2 <= ratio <= 1.2, (loaded.forward.median, [x.forward.median for x in quiet])
