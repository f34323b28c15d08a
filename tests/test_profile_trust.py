"""A profile taken on a busy machine: untrusted cards are flagged (the host's load counted for each
card, not only for the forward), ranked by their bytes and FLOPs rather than by a time orders of
magnitude off, the op table says in one line why its shares add up past the forward, and the cards
are timed again, and written back, once the machine is quiet. No test here depends on the
machine's load: the quietness checks are faked where a test needs them one way or the other."""

from __future__ import annotations

import json

import pytest
from conftest import FAST_TOML
from search_helpers import synthetic_card

from forge_tui.profiler import run as run_mod
from forge_tui.profiler.trust import distrust, rank_shares, ranked, shares_note
from forge_tui.table import display_name, render
from forge_tui.timing import Stats


def triu_under_load():
    """Cards as a busy two-core machine profiled them (a forward of 1000 µs): a 16x16 triu timed at
    20 ms a call (its floor 0.02 µs), shares past 100% in all."""
    specs = [("norm", 200.0, 1.0), ("mm", 150.0, 100.0), ("add", 10.0, 0.05), ("mul", 8.0, 0.05), ("neg", 9.0, 0.05),
             ("triu", 20000.0, 0.02)]
    cards = [synthetic_card(cid, share=t / 1000.0, time_us=t, floor_us=floor) for cid, t, floor in specs]
    cards[-1].flags = ["noisy_timing"]
    for c in cards:
        c.calls = 1
    return cards


def test_an_untrusted_card_ranks_by_its_bytes_and_flops_not_its_time():
    cards = triu_under_load()
    triu = cards[-1]
    assert distrust(triu) == "timed while the machine was busy" and distrust(cards[0]) is None
    shares = rank_shares(cards)
    # its floor plus what an op costs above its floor here (about 10 µs): among the small ops,
    # not first as its 20 ms (2000% of the forward) would put it
    assert shares["triu"] == pytest.approx((0.02 + 9.95) / 1000.0)
    assert [c.id for c in ranked(cards)][:2] == ["norm", "mm"]
    # no trusted card at all: floors and op counts alone order them
    for c in cards:
        c.flags = ["noisy_timing"]
    assert [c.id for c in ranked(cards)][0] == "mm"


def test_shares_past_the_forward_are_said_in_one_line():
    cards = triu_under_load()
    note = shares_note(cards)
    assert note is not None and "2037.7%" in note and "1 card(s) marked ?" in note and "\n" not in note
    # nested op cards count through their module card: left out of the sum
    assert shares_note(cards, nested={"triu"}) is None
    cards[-1].flags = []
    assert "timed alone" in shares_note(cards)


def test_the_op_table_text_marks_untrusted_cards_and_ranks_them_low():
    cards = triu_under_load()
    text = render(cards, title="t", served={})
    rows = [line.split()[1] for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert rows[:2] == ["norm", "mm"] and rows.index("triu") > 1
    triu_line = next(line for line in text.splitlines() if " triu " in line)
    assert "20000.0?" in triu_line and "2000.0%?" in triu_line
    assert "shares add up to 2037.7% of the forward" in text and "ranked by bytes and FLOPs" in text


def test_a_card_is_named_as_a_person_names_it():
    from forge_tui.cards import Card, TensorSpec

    x = TensorSpec(shape=[4, 16, 64], stride=[1024, 64, 1], dtype="bfloat16")
    w = TensorSpec(shape=[64], stride=[1], dtype="bfloat16", role="param")
    norm = Card(id="mod-RMSNorm-0123456789", kind="module", target="module:RMSNorm", label="", inputs=[x, w],
                outputs=[x.model_copy(update={"role": "output"})], program={}, dtype="bfloat16")
    assert display_name(norm) == "RMSNorm 4x16x64 bf16"
    chain = norm.model_copy(update={"kind": "chain", "target": "chain:mul+slice+slice+neg+cat+mul+add"})
    assert display_name(chain) == "mul+slice+…+add 4x16x64 bf16"


class FakeCalibration:
    device = "cpu"

    def __init__(self, slow: bool = False) -> None:
        self.slow = slow

    def measure(self) -> float:
        return 50.0 if self.slow else 1.0

    def loaded(self, value: float, max_slowdown: float) -> str | None:
        return "the calibration workload ran 50.0x slower than its best" if value > max_slowdown else None


class FakeTimer:
    overhead_iqr_us = 0.1

    def __init__(self) -> None:
        self.calls = 0

    def time(self, fns):
        self.calls += 1
        return {name: Stats.from_samples([10.0, 10.0, 10.0]) for name in fns}, None, None


def test_each_card_counts_the_hosts_load_and_a_busy_machine_does_not_triple_the_profile(fast_cfg, monkeypatch):
    """More threads ready to run than CPUs flags a card as noisy (the calibration workload can miss
    such load); once two cards in a row stayed loud after their retries, later cards get one
    attempt each until one comes out quiet."""
    cfg = fast_cfg.timing.model_copy(update={"max_slowdown": 1.5, "noisy_retries": 2})
    load = iter([3.0] * 16 + [0.5] * 10)  # read before and after each attempt
    monkeypatch.setattr(run_mod, "oversubscription", lambda: next(load))
    timer = FakeTimer()
    quiet = run_mod.QuietTimer(timer, FakeCalibration(), cfg)  # type: ignore[arg-type]
    attempts = []
    for _ in range(4):
        before = timer.calls
        _, noisy = quiet.time("card", lambda: None, host_load=True)
        attempts.append(timer.calls - before)
        assert noisy and "threads ready to run" in noisy[0]
    assert attempts == [3, 3, 1, 1]
    _, noisy = quiet.time("card", lambda: None, host_load=True)  # quiet again
    assert not noisy and quiet.loud_in_row == 0
    assert quiet.busy() is None
    assert "slower than its best" in run_mod.QuietTimer(timer, FakeCalibration(slow=True), cfg).busy()  # type: ignore[arg-type]


def test_a_profile_on_an_oversubscribed_host_flags_every_card(tmp_path, fast_cfg, monkeypatch):
    """The profile counts the threads ready to run around each card's timing, as around the
    forward's: with more of them than CPUs, every card is flagged (the calibration workload, faked
    quiet here, can miss such load)."""
    from forge_tui.profiler.run import profile_workload
    from forge_tui.quiet import Calibration
    from forge_tui.tensorstore import TensorStore
    from forge_tui.workload import load_workload

    cfg = fast_cfg.model_copy(update={"timing": fast_cfg.timing.model_copy(update={"max_slowdown": 1.5})})
    monkeypatch.setattr(run_mod, "oversubscription", lambda: 3.0)
    monkeypatch.setattr(Calibration, "loaded", lambda self, value, max_slowdown=1.5: None)
    result = profile_workload(load_workload("example:kb_softmax"), "cpu", None, cfg, TensorStore(tmp_path))
    assert result.cards and all("noisy_timing" in c.flags for c in result.cards)
    assert result.forward_noisy


@pytest.fixture
def loud_workspace(tmp_path):
    """tiny_mlp profiled, then its smallest card made to look as a busy machine timed it."""
    from forge_tui.workspace import profile_into_workspace

    cfg = tmp_path / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, _ = profile_into_workspace("example:tiny_mlp", tmp_path / "ws", device="cpu", config_path=cfg)
    smallest = min((c for c in ws.cards() if c.share), key=lambda c: c.share)
    path = ws.cards_dir / f"{smallest.id}.json"
    card = json.loads(path.read_text())
    card["time_us"], card["share"], card["flags"] = 1e6, 9.0, ["noisy_timing", "share_over_forward"]
    path.write_text(json.dumps(card))
    with ws.git() as repo:
        repo.commit_worktree("a busy machine")
    return ws, card["id"]


def test_untrusted_cards_wait_while_the_machine_is_busy(loud_workspace, monkeypatch):
    from forge_tui.workspace import retime_cards

    ws, cid = loud_workspace
    with ws.git() as repo:
        head = repo.head()
    monkeypatch.setattr(run_mod.QuietTimer, "busy", lambda self: "2.5x as many threads ready to run as CPUs")
    out = retime_cards(ws)
    assert out.waiting == [cid] and not out.retimed and "threads ready to run" in out.busy
    with ws.git() as repo:
        assert repo.head() == head  # nothing timed, nothing written
    assert "noisy_timing" in ws.card(cid).flags


def test_untrusted_cards_are_timed_again_once_the_machine_is_quiet(loud_workspace, monkeypatch):
    from forge_tui.workspace import retime_cards

    ws, cid = loud_workspace
    monkeypatch.setattr(run_mod.QuietTimer, "busy", lambda self: None)
    out = retime_cards(ws)
    assert out.retimed == [cid] and not out.waiting and out.busy is None, out
    card = ws.card(cid)
    assert not card.flags and card.time_us < 1e5 and 0 < card.share <= 1.0
    forward = ws.profile_summary()["forward_us"]["median"]
    assert card.share == pytest.approx(card.total_us / forward)
    assert "?" not in (ws.root / "optable.txt").read_text()
    with ws.git() as repo:
        assert "Forge-Event: retime-cards" in repo.git("log", "-1", "--format=%B")
    assert retime_cards(ws).line() == "every card's time is trusted"
