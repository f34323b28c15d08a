"""The newcomer's first ten minutes (issue 56), one test or more per item, with Pilot on the
fixture backend (tests/ui_fixtures.py): searches and retimes publish scripted events, released by
the test where it needs a node to land at a given moment. Nothing here is timed: a busy machine
is a scripted ``noisy`` verdict, and no assertion depends on the machine's speed or load."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from ui_fixtures import RMS, SOFTMAX, FixtureBackend, FixtureDescriber, screen_text

from forge_tui.cards import Card
from forge_tui.search.events import BestImproved, NodeAdded, SearchStarted, SearchStopped
from forge_tui.ui.app import ForgeApp
from forge_tui.ui.state import SearchState
from forge_tui.ui.widgets.common.guide import Guide
from forge_tui.ui.widgets.search.node_panes import NodePanes
from forge_tui.ui.widgets.search.source import SourceView
from forge_tui.ui.widgets.search.tree import SearchTree, TreePane
from forge_tui.ui.widgets.workload.card_detail import CardDetail
from forge_tui.ui.widgets.workload.op_table import OpTable

BUSY = ("correct, but the machine was too busy to trust the timing: the calibration workload ran 354.9x slower than "
        "its best (40029.3 µs against 112.8 µs): the machine is busy; the candidate's samples spread 205% (IQR 957.3 "
        "µs on a median of 467.0 µs; at most 15% is trusted)")


def make_app(backend: FixtureBackend | None = None, **kw) -> ForgeApp:
    return ForgeApp(Path("fixture"), backend=backend or FixtureBackend(), describer=FixtureDescriber(),
                    live_refresh=False, **kw)


async def until(pilot, cond, what: str, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}; the log:\n" + "\n".join(pilot.app.log_lines[-10:]))


async def settle(pilot) -> None:
    for _ in range(2):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def node(card: str, nid: str, parent: str | None, status: str, seq: int, speedup: float | None = None,
         move: str = "rownorm", reason: str = "", proposer: str = "templates") -> NodeAdded:
    return NodeAdded(seq=seq, card=card, node=nid, parent=parent, status=status, speedup=speedup, move=move,
                     proposer=proposer, reason=reason)


def noisy_search() -> list:
    """Every evaluation of the search noisy: the machine was busy throughout."""
    return [SearchStarted(seq=20, cards=[RMS, SOFTMAX], backend="cpu", proposer="templates",
                          config={"max_evals": 4, "evals_per_card": 2}),
            node(RMS, "n0004", "root", "noisy", 21, reason=BUSY),
            node(SOFTMAX, "n0004", "root", "noisy", 22, reason=BUSY),
            node(RMS, "n0005", "n0004", "noisy", 23, reason=BUSY),
            node(SOFTMAX, "n0005", "root", "noisy", 24, reason=BUSY),
            SearchStopped(seq=25, reason="evaluation budget spent (10 of 10)", evaluations=10)]


def tree_labels(tree: SearchTree) -> dict[tuple[str, str | None], str]:
    out = {}

    def walk(n):
        for child in n.children:
            if child.data is not None:
                out[child.data] = str(child.label)
            walk(child)

    walk(tree.root)
    return out


# ---- 1. the op table -----------------------------------------------------------------------------
class LateCards(FixtureBackend):
    """Cards that arrive once the test lets them (rows after the table was mounted and drawn)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def cards(self) -> list[Card]:
        self.release.wait(30)
        return super().cards()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_the_op_table_fits_rows_that_arrive_after_it_is_drawn(size):
    backend = LateCards()

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=size) as pilot:
            table = app.screen.query_one(OpTable)
            await pilot.pause(0.3)
            assert table.row_count == 0
            backend.release.set()
            await until(pilot, lambda: table.row_count == 6, "the rows")
            await settle(pilot)
            widths = dict(table.layout_widths)
            for c in table.cards:
                cells = table.cells(c)
                for key, width in table.layout_widths:
                    assert len(cells[key]) <= width, (key, cells[key], width)  # nothing cut
            text = screen_text(app)
            assert "RMSNorm 2x16x64 fp32" in text and "RotaryEmbedding 2x16x64 fp32" in text and "17.5%" in text
            assert ("mod-RMSNorm-7be6e8fcef" in text.split("evals")[0]) == (size[0] >= 120)  # the id where room
            # moving the cursor redraws no row at another width: every row's share ends in one column
            for _ in range(4):
                await pilot.press("down")
            await pilot.pause()
            assert dict(table.layout_widths) == widths
            rows = [line for line in screen_text(app).splitlines() if "%" in line and "fp32" in line]
            assert len(rows) == 6 and len({line.index("%") for line in rows}) == 1, rows

    asyncio.run(scenario())


# ---- 2. a profile taken under load ---------------------------------------------------------------
class LoudProfile(FixtureBackend):
    """The mean card as a busy machine timed it (20 ms a call, 95% of the forward); it is timed
    again on the second try, once the machine is quiet."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0
        self.loud = True

    def cards(self) -> list[Card]:
        cards = super().cards()
        if self.loud:
            at = next(i for i, c in enumerate(cards) if c.id.startswith("mean"))
            cards[at] = cards[at].model_copy(update={"time_us": 20000.0, "share": 0.95, "headroom": 400000.0,
                                                     "flags": ["noisy_timing"]})
        return cards

    def retime_cards(self, stop=lambda: False, progress=lambda line: None):
        from forge_tui.profiler.retime import CardRetime

        self.tries += 1
        mean = next(c.id for c in super().cards() if c.id.startswith("mean"))
        if self.tries == 1:
            return CardRetime(waiting=[mean], busy="2.5x as many threads ready to run as CPUs: the machine is busy")
        self.loud = False
        return CardRetime(retimed=[mean], changed=True)


def test_a_loud_card_ranks_by_bytes_and_flops_until_it_is_timed_again_on_a_quiet_machine():
    backend = LoudProfile()

    async def scenario():
        app = make_app(backend)
        app.cards_waits = (30.0,)
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.screen.query_one(OpTable)
            await until(pilot, lambda: table.row_count == 6 and app.cards_next is not None, "the first try")
            await pilot.pause(0.2)
            mean = next(c for c in table.cards if c.id.startswith("mean"))
            # ranked by its bytes and FLOPs, under the RMSNorm, not first as its 95% would put it
            assert table.cards[0].id == RMS and table.cards.index(mean) > 1
            assert table.cells(mean)["time"] == "20000.0?" and table.cells(mean)["share"] == "95.0%?"
            note = str(app.screen.query_one("#table-note").content)
            assert "shares add up to" in note and "marked ?" in note
            assert "next try in" in note and "threads ready to run" in note
            table.move_cursor(row=table.cards.index(mean))
            await pilot.pause()
            detail = str(app.screen.query_one(CardDetail).query_one("#card-text").content)
            assert "not trusted" in detail and "ranked by its bytes and FLOPs" in detail
            # the machine is quiet: the next try times it, the table ranks it by its time again
            app._maybe_retime_cards(scheduled=True)
            await until(pilot, lambda: backend.tries == 2 and not any("?" in table.cells(c)["time"]
                                                                       for c in table.cards), "the retime")
            await pilot.pause(0.2)
            shares = [c.share for c in table.cards]
            assert shares == sorted(shares, reverse=True) and "8.7" in [table.cells(c)["time"] for c in table.cards]
            assert not app.screen.query_one("#table-note").display

    asyncio.run(scenario())


# ---- 3. a search whose every evaluation is noisy ---------------------------------------------------
def retime_rounds() -> list[list]:
    """Round one: still busy; round two: the first kernel passes 1.5x faster than eager."""
    return [[SearchStarted(seq=30, cards=[RMS, SOFTMAX], proposer="retime", config={"max_evals": 4}),
             node(RMS, "n0006", "n0004", "noisy", 31, move="retime n0004", reason=BUSY, proposer="retime"),
             SearchStopped(seq=32, reason="every noisy kernel timed again")],
            [SearchStarted(seq=33, cards=[RMS], proposer="retime", config={"max_evals": 4}),
             node(RMS, "n0007", "n0004", "passed", 34, speedup=1.5, move="retime n0004", proposer="retime"),
             BestImproved(seq=34, card=RMS, node="n0007", speedup=1.5, previous=1.0),
             SearchStopped(seq=35, reason="every noisy kernel timed again")]]


def noisy_backend() -> FixtureBackend:
    backend = FixtureBackend(history=False)
    backend.script = noisy_search()
    backend.requests_open = False
    backend.retime_rounds = retime_rounds()
    backend.offer_after_retime = True
    return backend


def test_noise_costs_time_not_the_outcome():
    """Every evaluation noisy: the app times the correct kernels again by itself, showing the wait
    and its reason, t starts the next round at once, the retimes land in the live tree, and once a
    kernel is timed faster than eager the guide sends the user to approve it."""
    backend = noisy_backend()

    async def scenario():
        app = make_app(backend)
        app.retime_waits = (3600.0,)  # longer than any wait of the test: only t ends it
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("g")
            await until(pilot, lambda: app.retiming and app.retime_next is not None, "the wait after round one")
            guide = app.guide_text()
            assert "timed on a busy machine" in guide and "the calibration workload ran 354.9x slower" in guide
            assert "timed again in" in guide and "t: now" in guide and "x stops" in guide
            # the screen shows the same guide once it has refreshed (a loaded machine may still show
            # the round before; its countdown may have ticked since)
            countdown = re.compile(r"again in \d+ s")
            await until(pilot, lambda: countdown.sub("again in N s", guide) ==
                        countdown.sub("again in N s", app.screen.query_one(Guide).text), "the guide on the screen")
            await pilot.press("2")
            tree = app.screen.query_one(SearchTree)
            await until(pilot, lambda: (RMS, "n0006") in tree_labels(tree), "the retime in the live tree")
            assert "retime" in tree_labels(tree)[(RMS, "n0006")]
            await pilot.press("t")  # the next round now
            await until(pilot, lambda: not app.retiming and app.requests_pending == 1, "a verdict")
            assert "1 kernel(s) beat eager: 4 shows the evidence" in app.guide_text()
            assert "n0007" in tree_labels(tree)[(RMS, "n0007")] and "★" in tree_labels(tree)[(RMS, "n0007")]
            await pilot.press("4")
            await until(pilot, lambda: app.screen.query_one("RequestQueue").row_count == 1, "the queue")
            await pilot.press("y")
            await until(pilot, lambda: backend.approved == [RMS], "the approval")

    asyncio.run(scenario())


def test_x_stops_the_retimes_and_the_guide_names_a_key_that_works():
    backend = noisy_backend()
    backend.offer_after_retime = False

    async def scenario():
        app = make_app(backend)
        app.retime_waits = (3600.0,)  # longer than any wait of the test: only t ends it
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("g")
            await until(pilot, lambda: app.retime_next is not None, "the wait")
            await pilot.press("x")
            await until(pilot, lambda: not app.retiming, "the stop")
            guide = app.guide_text()
            assert "t times them again" in guide and "g searches 12 more evaluations" in guide
            # g: the recorded evaluations spent the budget, so g raises it by a run's worth and searches
            evals = app.state.evaluations
            backend.script = []
            await pilot.press("g")
            await until(pilot, lambda: len(backend.searches) == 2, "the second search")
            assert backend.settings[-1]["max_evals"] == evals + 12
            await until(pilot, lambda: not app.search_running, "its end")
            # nothing left to time: the guide shows the budgets' table name with its brackets
            backend.retime_rounds = []
            app.retime_auto = False
            app.state = SearchState.of([e for e in noisy_search() if not isinstance(e, NodeAdded)])
            app.requests_pending = app.promoted_count = 0
            app._guide()
            await pilot.pause()
            text = app.screen.query_one(Guide).text
            assert "g searches 12 more evaluations (budgets: forge.toml [search])" in text

    asyncio.run(scenario())


# ---- 4 and 5. the search tree --------------------------------------------------------------------
def test_the_tree_shows_searched_cards_first_and_the_rest_under_one_collapsed_line():
    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            tree = app.screen.query_one(SearchTree)
            tops = [str(n.label) for n in tree.root.children]
            assert tops[0].startswith("RMSNorm 2x16x64 fp32") and tops[1].startswith("_softmax 2x4x256 fp32")
            assert tops[-1] == "not searched (1)" and not tree.root.children[-1].is_expanded
            left_out = tree.root.children[-1].children[0]
            assert "mm 32x64·64x128 fp32" in str(left_out.label) and "left to the LLM agent" in str(left_out.label)
            narrow = app.screen.query_one(TreePane).size.width
            # a failure's reason is cut in its line and whole in the line under the tree
            tree.focus()
            for _ in range(4):
                await pilot.press("down")
            await pilot.pause()
            assert tree.cursor_node.data == (RMS, "n0002")
            line = str(app.screen.query_one("#tree-line").content)
            assert "build_failed" in line and "g++ failed: 2 errors" in line and "rownorm: vec=8" in line
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            assert app.screen.query_one(TreePane).size.width > narrow  # the tree pane follows the terminal

    asyncio.run(scenario())


def test_the_cursor_and_the_panes_stay_on_the_selected_node_while_nodes_land():
    backend = FixtureBackend(history=False)
    backend.script = [SearchStarted(seq=1, cards=[RMS, SOFTMAX], proposer="templates", config={"max_evals": 6}),
                      node(RMS, "root", None, "reference", 2, 1.0, "eager PyTorch", proposer="reference"),
                      node(SOFTMAX, "root", None, "reference", 3, 1.0, "eager PyTorch", proposer="reference"),
                      node(SOFTMAX, "n0001", "root", "crash", 4, reason="SIGSEGV"),
                      node(RMS, "n0001", "root", "passed", 5, 1.4),
                      node(RMS, "n0002", "n0001", "passed", 6, 1.6),
                      node(RMS, "n0003", "root", "build_failed", 7, reason="g++ failed"),
                      SearchStopped(seq=8, reason="evaluation budget spent (4 of 6)", evaluations=4)]
    backend.gate = threading.Semaphore(0)

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("g")
            for _ in range(4):
                backend.gate.release()
            await until(pilot, lambda: app.state.node(SOFTMAX, "n0001") is not None, "the first nodes")
            await pilot.press("2")
            tree = app.screen.query_one(SearchTree)
            await until(pilot, lambda: (SOFTMAX, "n0001") in tree_labels(tree), "the crash in the tree")
            tree.focus()
            target = next(n for n in _walk(tree.root) if n.data == (SOFTMAX, "n0001"))
            tree.move_cursor(target)
            panes = app.screen.query_one(NodePanes)
            await until(pilot, lambda: panes.detail is not None and panes.detail.node == "n0001"
                        and panes.detail.card == SOFTMAX, "its panes")
            line_before = tree.cursor_line
            # nodes land on the card above it: the cursor's line moves, the cursor does not
            for _ in range(3):
                backend.gate.release()
            await until(pilot, lambda: (RMS, "n0003") in tree_labels(tree), "the new nodes")
            await pilot.pause(0.3)
            assert tree.cursor_node.data == (SOFTMAX, "n0001") and tree.cursor_line > line_before
            assert (panes.detail.card, panes.detail.node) == (SOFTMAX, "n0001")
            backend.gate.release()

    asyncio.run(scenario())


def _walk(n):
    for child in n.children:
        yield child
        yield from _walk(child)


# ---- 6. from an error to its line --------------------------------------------------------------
def test_enter_on_an_error_or_a_build_failure_shows_its_line_from_its_start():
    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            tree = app.screen.query_one(SearchTree)
            tree.focus()
            for _ in range(4):
                await pilot.press("down")
            await settle(pilot)
            assert tree.cursor_node.data == (RMS, "n0002")
            # e, then Enter at once: the first diagnostic's line, the cursor at its start
            await pilot.press("e")
            await pilot.pause()
            errors = app.screen.query_one("#errors-list")
            assert errors.has_focus and errors.highlighted == 0
            await pilot.press("enter")
            await pilot.pause()
            source = app.screen.query_one(SourceView)
            panes = app.screen.query_one(NodePanes)
            assert panes.active == "source" and source.has_focus
            assert source.cursor_location == (8, 0) and source.scroll_offset.x == 0
            assert "undefined_call" in source.document.get_line(8)
            # Enter on the build failure in the tree does the same
            source.move_cursor((0, 0))
            panes.active = "diff"
            tree.focus()
            await pilot.press("enter")
            await pilot.pause()
            assert panes.active == "source" and source.cursor_location == (8, 0)

    asyncio.run(scenario())


# ---- 7. the end-to-end table -------------------------------------------------------------------
def test_the_end_to_end_table_computes_its_ratio_from_the_times_it_shows():
    from forge_tui.ui.backend import BenchOutcome, Variant

    out = BenchOutcome([Variant("eager", 13551.0, 13000.0, 14000.0, "-"), Variant("eager+forge", 12397.9, 12000.0,
                                                                                  12800.0)], paired=(0.960, 0.93, 0.99))
    text = out.render()
    assert f"{13551.0 / 12397.9:.3f}x" in text and "eager's median over the variant's median" in text
    assert "paired runs" in text and "0.960x" in text and "disagree" in text
    assert out.guide().startswith(f"end to end: eager + forge {13551.0 / 12397.9:.2f}x eager (the paired runs disagree")

    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("3", "b")
            await until(pilot, lambda: app.bench_outcome is not None, "the model run")
            await settle(pilot)
            text = str(app.screen.query_one("#bench-text").content)
            assert "1.093x" in text and "Amdahl bound 1.123x" in text
            assert "1.09x eager" in app.guide_text()

    asyncio.run(scenario())


def test_the_bound_is_the_amdahl_bound_of_the_served_cards():
    from types import SimpleNamespace

    from ui_fixtures import FixtureBackend as F

    from forge_tui.timing import Stats
    from forge_tui.ui.backend import amdahl

    cards = F().cards()
    rms = next(c for c in cards if c.id == RMS)
    eager = Stats.from_samples([1000.0] * 3)
    # 5 calls of 40 µs in eager's forward of 1000 µs (20%), served at 20 µs (2x): 1 / (1 - 0.2 x 0.5)
    r = SimpleNamespace(times={"eager": eager}, served={RMS: 5}, switched_off={}, own_times={RMS: (40.0, 20.0)})
    bound, why = amdahl(r, cards, [])
    assert bound == pytest.approx(1 / 0.9) and "20.0% of eager's forward at 2.00x" in why
    # no own times: its profiled share and its evidence; a share timed on a busy machine gives no
    # bound rather than a made-up one (a share past 100% once made the bound the card's own speedup)
    r.own_times = {}
    promoted = [F()._entry(RMS)]
    bound, why = amdahl(r, cards, promoted)
    assert bound == pytest.approx(1 / (1 - rms.share * (1 - 1 / 1.87)))
    rms.flags = ["noisy_timing"]
    bound, why = amdahl(r, cards, promoted)
    assert bound is None and "trusted share" in why


# ---- 8. the agent's transcript -------------------------------------------------------------------
def test_the_agent_pane_shows_tokens_cached_tokens_and_cost_and_readable_entries():
    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            tree = app.screen.query_one(SearchTree)
            tree.focus()
            target = next(n for n in _walk(tree.root) if n.data == (SOFTMAX, "n0002"))
            tree.move_cursor(target)
            await settle(pilot)
            await pilot.press("a")
            await settle(pilot)
            texts = [str(s.content) for s in app.screen.query("TranscriptView Static")]
            joined = "\n".join(texts)
            assert "1 queries: 1,200 in + 300 out tokens, cached 800 read; $0.0042" in texts[0]
            assert "query claude-sonnet-4-6: 1,200 in + 300 out tokens, cached 800 read, $0.0042" in joined
            assert "conversation c0007 on _softmax-3b2a8c03bf from root" in joined
            assert "system prompt, " in joined and "{" not in joined.replace("compile({})", "")

    asyncio.run(scenario())


# ---- 9. explanations are whole -------------------------------------------------------------------
def test_a_long_reason_is_whole_in_the_approvals_pane():
    backend = FixtureBackend()
    backend.rejected.append(RMS)
    backend.not_offered = [(RMS, f"n0004 is correct, but the machine was too busy to trust its timing ({BUSY})")]

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("4")
            evidence = app.screen.query_one("#evidence-text")
            await until(pilot, lambda: "too busy" in str(evidence.content), "the reasons")
            assert BUSY in str(evidence.content)

    asyncio.run(scenario())


# ---- 10. every screen at 80x24 -------------------------------------------------------------------
def test_every_screen_is_usable_at_80x24():
    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            guide = app.screen.query_one(Guide)
            assert guide.size.height >= len(textwrap.wrap(guide.text, guide.size.width))  # not cut
            log = app.screen.query_one("#status")
            assert log.lines and max(strip.cell_length for strip in log.lines) <= log.size.width  # wrapped
            text = screen_text(app)
            assert "floor 0.20 µs, headroom 147.5x" in text  # the card pane's numbers above its fold
            card = app.screen.query_one(CardDetail)
            assert card.max_scroll_y > 0 and card.can_focus  # the rest scrolls
            await pilot.press("3")
            await settle(pilot)
            text = screen_text(app)
            assert all(h in text for h in ("served", "fell back", "dispatch"))  # the status row whole
            assert "switched off: the forward ran 41.0 µs with it" in text

    asyncio.run(scenario())


# ---- 11. quitting does not wait ------------------------------------------------------------------
def test_q_quits_while_an_evaluation_is_in_flight():
    """A search whose evaluation never ends (it ignores the stop, as a running candidate does): q
    ends the app without waiting for it, and the search is told to stop."""
    backend = FixtureBackend(history=False)
    backend.script = [SearchStarted(seq=1, cards=[RMS], proposer="templates")]
    backend.gate = threading.Semaphore(0)
    backend.stubborn = True

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("g")
            await until(pilot, lambda: backend.searches and backend.searches[0].running.is_set(), "the search")
            await pilot.press("q")
        return app

    app = asyncio.run(scenario())
    search = backend.searches[0]
    assert not search.done.is_set() and search.stop_reason == "the app quit"  # nothing waited for it
    app.release()
    assert search.abandoned
    backend.gate.release()


FINISH = """
import sys, threading
sys.path.insert(0, {tests!r})
from pathlib import Path
from ui_fixtures import FixtureBackend, FixtureDescriber, ScriptedSearch
from forge_tui.ui.app import ForgeApp
from forge_tui.ui.startup import finish

from concurrent.futures import ThreadPoolExecutor

def abandon(self, timeout=0.5):
    print("abandoned", flush=True)  # finish() ends the process right after: say it here
    return True

def run(self, resume=False):
    # as the search's loop does: its evaluation in a thread pool's (non-daemon) thread, which the
    # interpreter's own exit joins; this one never ends
    self.running.set()
    ThreadPoolExecutor(max_workers=1).submit(threading.Event().wait).result()

ScriptedSearch.abandon = abandon
ScriptedSearch.run = run

backend = FixtureBackend(history=False)
app = ForgeApp(Path("fixture"), backend=backend, describer=FixtureDescriber(), live_refresh=False)

async def drive(pilot):
    while not app.cards:
        await pilot.pause(0.05)
    await pilot.press("g")
    while not (backend.searches and backend.searches[0].running.is_set()):
        await pilot.pause(0.05)
    await pilot.press("q")

app.run(headless=True, size=(80, 24), auto_pilot=drive)
sys.exit(finish(app))
"""


def test_the_process_ends_without_joining_a_worker_that_never_ends(tmp_path):
    """``forge-tui``'s end (``finish``): the search abandoned, and the process exits with 0 while
    a worker thread is still blocked (the interpreter's own exit would join it forever)."""
    script = tmp_path / "finish.py"
    script.write_text(FINISH.format(tests=str(Path(__file__).parent)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["abandoned"]


UI_THREAD = """
import sys, threading, asyncio, importlib.abc
sys.path.insert(0, {tests!r})
main_imports = []

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("torch", "anthropic", "openai") and threading.current_thread() is threading.main_thread():
            main_imports.append(name)
        return None

sys.meta_path.insert(0, Watch())
from pathlib import Path
from ui_fixtures import FixtureBackend
from forge_tui.ui.app import ForgeApp

async def main():
    app = ForgeApp(Path("fixture"), backend=FixtureBackend(), live_refresh=False)
    async with app.run_test(size=(80, 24)) as pilot:
        while not app.cards:
            await pilot.pause(0.05)
        for key in "23456717":
            await pilot.press(key)
            await pilot.pause(0.2)
        await app.workers.wait_for_complete()
        await pilot.pause(0.5)

asyncio.run(main())
print("main-thread imports:", sorted(set(main_imports)))
"""


def test_the_ui_thread_never_imports_torch_or_an_llm_sdk(tmp_path):
    """Seconds of imports (torch, the SDKs the describe screen checks for) happen in workers: the
    first paint and every screen switch never wait on them."""
    script = tmp_path / "ui_thread.py"
    script.write_text(UI_THREAD.format(tests=str(Path(__file__).parent)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "main-thread imports: []" in proc.stdout, proc.stdout


# ---- 12. the smaller ones ------------------------------------------------------------------------
def test_describe_takes_no_input_while_it_is_unavailable():
    from forge_tui.ui.describe_api import Unavailable

    async def scenario():
        app = ForgeApp(Path("fixture"), backend=FixtureBackend(), describer=Unavailable("no LLM agent configured"),
                       live_refresh=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("7")
            await settle(pilot)
            box = app.screen.query_one("#describe-input")
            assert box.disabled and "not available here: no LLM agent configured" in \
                str(app.screen.query_one("#describe-status").content)
            await pilot.press("i", "a")
            assert not box.has_focus and box.value == ""
            assert app.screen.query_one("Footer").display
        # available: i focuses the box, and the footer names the keys that work in it
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("7")
            await settle(pilot)
            await pilot.press("i")
            await pilot.pause()
            assert app.screen.query_one("#describe-input").has_focus
            footer = screen_text(app).splitlines()[-1]
            assert "Ask the agent" in footer and "Leave the box" in footer

    asyncio.run(scenario())


def test_empty_code_panes_show_no_line_number_and_the_plot_reaches_the_last_evaluation():
    from forge_tui.ui.widgets.plots.speedup import series

    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            assert not app.screen.query_one(SourceView).show_line_numbers

    asyncio.run(scenario())
    state = SearchState.of(noisy_search())
    state.evaluations = 24
    state.progress = [(3, RMS, 1.2), (12, SOFTMAX, 1.1)]
    assert {card: xs[-1] for card, (xs, _) in series(state).items()} == {RMS: 24, SOFTMAX: 24}
