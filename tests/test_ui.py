"""The Textual app's flows, driven with Pilot on real workspaces (the CPU backend): a template
search from the op table to a promoted kernel and the model run end to end; an approval and a
rejection; a replay stepped back and forth; a kernel crash and a build failure shown while the app
keeps working; a worker that fails becomes a message. One profiled workspace per module, copied
for each test that writes to it."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from conftest import FAST_TOML, timed_win, won_request

from forge_tui.ui.app import ForgeApp
from forge_tui.ui.backend import Backend
from forge_tui.ui.screens.approvals import ApprovalsScreen
from forge_tui.ui.screens.fallback import FallbackScreen
from forge_tui.ui.screens.replay import ReplayScreen
from forge_tui.ui.widgets.approvals.queue import RequestQueue
from forge_tui.ui.widgets.fallback.status_table import RuntimeStatus
from forge_tui.ui.widgets.search.errors import BuildErrors
from forge_tui.ui.widgets.search.node_panes import NodePanes
from forge_tui.ui.widgets.search.source import SourceView
from forge_tui.ui.widgets.search.tree import SearchTree
from forge_tui.ui.widgets.workload.card_detail import CardDetail
from forge_tui.ui.widgets.workload.op_table import OpTable

HERE = Path(__file__).parent
WORKLOAD = HERE / "data" / "workloads" / "rmsnorm.py"
CPU = HERE / "candidates" / "cpu"
SEARCH = {"max_evals": 2, "evals_per_card": 2, "parallel": 1, "min_gain": 0.0}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The RMSNorm workload profiled on the CPU (a module card that the templates serve as one
    fused kernel, and its op cards)."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("ui-ws")
    cfg = root / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, _ = profile_into_workspace(str(WORKLOAD), root / "ws", device="cpu", config_path=cfg)
    return ws


def module_card(ws):
    return next(c for c in ws.cards() if c.kind == "module")


def plan(tmp_path: Path, card: str, files: list[str]) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"cards": {card: [{"file": str(CPU / f), "move": f} for f in files]}}))
    return p


@pytest.fixture(scope="module")
def searched(profiled, tmp_path_factory):
    """A copy with a recorded search: a build failure, a crash, then a kernel that passes."""
    from forge_tui.session import Session

    card = module_card(profiled).id

    def search(attempt: int) -> tuple[Path, bool]:
        root = tmp_path_factory.mktemp("ui-searched")
        ws_root = root / "ws"
        shutil.copytree(profiled.root, ws_root, symlinks=True)
        p = plan(root, card, ["syntax_error.cpp", "segfault.cpp", "rmsnorm_good.cpp"])
        session = Session.open(ws_root).with_search_settings(max_evals=3, parallel=1, min_gain=0.0)
        with session.search(proposer=f"scripted:{p}", backend="cpu", cards=[card]) as s:
            s.run()
        return ws_root, won_request(ws_root)

    return timed_win(search)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


async def until(pilot, cond, timeout: float = 240.0, what: str = "") -> None:
    """Pause until cond() holds (the app answering meanwhile)."""
    steps = int(timeout / 0.05)
    for _ in range(steps):
        if cond():
            return
        await pilot.pause(0.05)
    app = pilot.app
    recent = "\n".join(getattr(app, "log_lines", [])[-12:])
    workers = ", ".join(f"{w.name}: {w.state.name}" for w in app.workers)
    raise AssertionError(f"timed out waiting for {what or cond}\nworkers: {workers or 'none'}\nthe app's log:\n{recent}")


def text_of(static) -> str:
    """What a Static shows, as plain text (Rich renderables printed on a wide console)."""
    import io

    from rich.console import Console

    content = static.content
    if isinstance(content, str):
        return content
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(content)
    return console.file.getvalue()


def tree_nodes(app) -> dict[tuple[str, str], str]:
    """(card, node) -> label of every node line in the search screen's tree."""
    tree = app.screen.query_one(SearchTree)
    out = {}

    def walk(node):
        for child in node.children:
            if child.data is not None and child.data[1] is not None:
                out[child.data] = str(child.label)
            walk(child)

    walk(tree.root)
    return out


async def select_node(pilot, app, card: str, node: str) -> None:
    tree = app.screen.query_one(SearchTree)
    tree.focus()
    for line in range(tree.last_line + 1):
        n = tree.get_node_at_line(line)
        if n is not None and n.data == (card, node):
            tree.move_cursor(n)
            break
    else:
        raise AssertionError(f"{card} {node} is not in the tree")
    await until(pilot, lambda: (panes := app.screen.query_one(NodePanes)).detail is not None
                and (panes.detail.card, panes.detail.node) == (card, node), 30, "the node's panes")


# ---- the whole flow ----------------------------------------------------------------------------
def test_template_search_from_the_op_table_to_a_promoted_kernel(profiled, tmp_path):
    card = module_card(profiled).id

    async def scenario(ws_root: Path) -> bool:
        """False where the search's best kernel was not timed faster than eager (``timed_win``)."""
        app = ForgeApp(ws_root, search=SEARCH, autostart=False, proposer="templates")
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.screen.query_one(OpTable)
            await until(pilot, lambda: table.row_count > 0, 30, "the op table")
            guide = app.guide_text()
            # the rewrites first (the bench's order): the search then leaves out the cards they replace
            assert "g searches kernels for every card" in guide and guide.index("3 then m") < guide.index("g searches")
            # choose the module card in the op table, then search
            table.move_cursor(row=[c.id for c in table.cards].index(card))
            await pilot.press("space")
            await pilot.pause()
            assert app.picks == {card} and "the 1 chosen cards" in app.guide_text()
            await pilot.press("g")
            await until(pilot, lambda: app.search_running, 10, "the search to start")
            await until(pilot, lambda: not app.search_running and app.state.stopped is not None, 240, "the search")
            assert not app.failures, [f.error for f in app.failures]
            assert app.state.evaluations == 2 and set(app.state.cards) == {card}
            await pilot.pause(0.3)
            assert table.get_cell(card, "search") in ("stopped", "finished")
            # the tree on the search screen, and a node's panes read from git
            await pilot.press("2")
            await pilot.pause()
            nodes = tree_nodes(app)
            assert {n for c, n in nodes} == {"root", "n0001", "n0002"}
            best, speedup = app.state.cards[card].best, app.state.cards[card].best_speedup
            if best is None or not speedup or speedup <= 1.0:
                return False  # measured no faster than eager this time: the search runs again
            assert nodes[(card, best)].startswith("★")
            await select_node(pilot, app, card, best)
            assert "forge_launch" in app.screen.query_one(SourceView).text
            # approve it: the guide sends the user to 4, y promotes it
            await until(pilot, lambda: app.requests_pending == 1, 30, "the promotion request")
            assert "4 shows the evidence" in app.guide_text()
            await pilot.press("4")
            queue = app.screen.query_one(RequestQueue)
            await until(pilot, lambda: queue.row_count == 1, 30, "the approvals queue")
            await pilot.press("y")
            await until(pilot, lambda: app.promoted_count == 1 and not app.screen.busy, 120, "the approval")
            from forge_tui.promotion import manifest
            from forge_tui.workspace import Workspace

            entry = manifest(Workspace.open(ws_root)).entries[card]
            assert entry.evidence.node == best and entry.builds
            assert "3 then b runs the whole model" in app.guide_text()
            # the fallback screen lists it; b runs the model end to end
            await pilot.press("3")
            status = app.screen.query_one(RuntimeStatus)
            await until(pilot, lambda: status.query_one("DataTable").row_count == 1, 30, "the fallback table")
            await pilot.press("b")
            await until(pilot, lambda: app.bench_outcome is not None or app.failures, 240, "the model run")
            assert not app.failures, [f.error for f in app.failures]
            assert "eager+forge" in app.bench_outcome.table and "end to end: eager + forge" in app.guide_text()
            await until(pilot, lambda: "served" in text_of(status.query_one("#runtime-why")), 10, "live status")
            return True

    def attempt(k: int) -> tuple[int, bool]:
        return k, asyncio.run(scenario(copy(profiled.root, tmp_path / f"ws{k}")))

    timed_win(attempt)


# ---- approvals -----------------------------------------------------------------------------------
def test_approval_with_evidence_and_a_rejection(searched, tmp_path):
    from forge_tui.promotion import manifest
    from forge_tui.workspace import Workspace

    ws_root = copy(searched, tmp_path / "ws")
    rejected_root = copy(searched, tmp_path / "ws2")

    async def approve_it():
        app = ForgeApp(ws_root)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")
            assert isinstance(app.screen, ApprovalsScreen)
            queue = app.screen.query_one(RequestQueue)
            await until(pilot, lambda: queue.row_count == 1, 30, "the queue")
            req = queue.current
            evidence = text_of(app.screen.query_one("#evidence-text"))
            assert f"{req.speedup:.3f}x eager" in evidence and "correct on" in evidence and "diff --git" in evidence
            await pilot.press("y")
            await until(pilot, lambda: app.screen.busy is None and queue.row_count == 0, 120, "the approval")
            assert any(line.startswith(f"approved {req.card.id}: {req.node}") for line in app.log_lines)
            return req

    req = asyncio.run(approve_it())
    assert manifest(Workspace.open(ws_root)).entries[req.card.id].evidence.node == req.node

    async def reject_it():
        app = ForgeApp(rejected_root)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("4")
            queue = app.screen.query_one(RequestQueue)
            await until(pilot, lambda: queue.row_count == 1, 30, "the queue")
            await pilot.press("n")
            await until(pilot, lambda: app.screen.busy is None and queue.row_count == 0, 60, "the rejection")

    asyncio.run(reject_it())
    man = manifest(Workspace.open(rejected_root))
    assert not man.entries and [r.node for r in man.rejected] == [req.node]


# ---- replay ------------------------------------------------------------------------------------
def test_replay_steps_back_and_forth(searched):
    async def scenario():
        app = ForgeApp(searched)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("5")
            screen = app.screen
            assert isinstance(screen, ReplayScreen)
            await until(pilot, lambda: screen.feed.events, 30, "the history")
            total = len(screen.feed.events)
            assert screen.feed.step == total
            full = set(tree_nodes(app))
            assert {n for _, n in full} == {"root", "n0001", "n0002", "n0003"}
            card = next(iter(full))[0]
            # back to the start: nothing; forward event by event, the tree grows in the recorded order
            await pilot.press("home")
            assert screen.feed.step == 0 and tree_nodes(app) == {}
            seen = []
            for _ in range(total):
                await pilot.press("right")
                names = [n for _, n in tree_nodes(app)]
                if names and (not seen or names != seen[-1]):
                    seen.append(names)
            assert [len(s) for s in seen] == [1, 2, 3, 4]
            assert screen.feed.step == total
            # one step back from the end: the last event (search stopped) is undone, its nodes kept
            await pilot.press("left")
            assert screen.feed.step == total - 1 and screen.shown_state.stopped is None
            assert "step" in text_of(screen.query_one("#replay-bar"))
            # every pane shows the node as recorded
            while (card, "n0001") in tree_nodes(app):
                await pilot.press("left")
            assert (card, "n0001") not in tree_nodes(app)
            await pilot.press("end")
            await select_node(pilot, app, card, "n0002")
            await pilot.press("r")
            assert "CRASH" in text_of(app.screen.query_one("#tests-verdict"))

    asyncio.run(scenario())


# ---- crashes -------------------------------------------------------------------------------------
def test_a_kernel_crash_is_shown_and_the_app_keeps_working(profiled, tmp_path):
    ws_root = copy(profiled.root, tmp_path / "ws")
    card = module_card(profiled).id
    p = plan(tmp_path, card, ["segfault.cpp", "syntax_error.cpp"])

    async def scenario():
        app = ForgeApp(ws_root, search={"max_evals": 2, "parallel": 1, "min_gain": 0.0}, autostart=True,
                       proposer=f"scripted:{p}")
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.state.stopped is not None and not app.search_running, 240, "the search")
            await pilot.press("2")
            await pilot.pause()
            nodes = tree_nodes(app)
            assert "crash" in nodes[(card, "n0001")] and "build_failed" in nodes[(card, "n0002")]
            assert "n0001 <- root: crash" in "\n".join(app.log_lines)
            await select_node(pilot, app, card, "n0001")
            await pilot.press("r")
            verdict = text_of(app.screen.query_one("#tests-verdict"))
            assert verdict.startswith("CRASH"), verdict
            # the build failure: the errors pane lists the compiler's diagnostic; Enter shows its line
            await select_node(pilot, app, card, "n0002")
            await pilot.press("e")
            errors = app.screen.query_one(BuildErrors)
            options = errors.query_one("OptionList")
            assert options.option_count >= 1 and "FAILED" in text_of(errors.query_one("#errors-summary"))
            options.focus()
            options.highlighted = 0
            await pilot.press("enter")
            await pilot.pause()
            source = app.screen.query_one(SourceView)
            assert app.screen.query_one(NodePanes).active == "source" and source.has_focus
            row = source.selection.end[0]
            assert "undeclared_name" in source.document.get_line(row)
            # still answering: screens switch, the op table moves
            await pilot.press("1", "down", "up", "6", "1")
            assert app.screen.query_one(OpTable).row_count == len(profiled.cards())
            assert not app.failures

    asyncio.run(scenario())


class FailingBackend(Backend):
    def node_detail(self, card: str, node: str):
        raise RuntimeError("git exploded")


def test_a_failing_worker_becomes_a_message(searched):
    async def scenario():
        app = ForgeApp(searched, backend=FailingBackend(searched))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.cards, 30, "the cards")
            await pilot.press("2")
            card = module_card_of(app)
            tree = app.screen.query_one(SearchTree)
            tree.focus()
            await pilot.press("down", "down")
            await until(pilot, lambda: app.failures, 30, "the failure")
            f = app.failures[0]
            assert f.where == "reading the node from git" and "RuntimeError: git exploded" in f.error
            assert any("error in reading the node from git" in line for line in app.log_lines)
            await pilot.press("1", "down")
            assert app.is_running and app.screen.query_one(OpTable).row_count and card

    asyncio.run(scenario())


def test_m_folds_and_groups_the_model_from_the_app(tmp_path):
    """On the fallback screen, m runs forge fold and forge experts on the workspace's model in a
    worker: a mixture-of-experts model gets its experts card promoted (the guide then points to the
    model run), a model without batch norms says so, and b then serves the card end to end."""
    from forge_tui.promotion import manifest
    from forge_tui.workspace import Workspace, profile_into_workspace

    cfg = tmp_path / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, _ = profile_into_workspace("example:tiny_moe", tmp_path / "ws", device="cpu", config_path=cfg)

    async def scenario():
        app = ForgeApp(ws.root, autostart=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.cards, 30, "the cards")
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, FallbackScreen), 10, "the fallback screen")
            await pilot.press("m")
            await until(pilot, lambda: not app.rewriting and any(line.startswith("experts: promoted")
                                                                 for line in app.log_lines), 120, "forge experts")
            assert not app.failures, [f.error for f in app.failures]
            assert any(line.startswith("fold:") and "no batch norm" in line for line in app.log_lines)
            assert any(line.startswith("experts: experts-") and "2 blocks" in line for line in app.log_lines)
            await until(pilot, lambda: app.promoted_count >= 1, 30, "the promoted count")
            assert "3 then b runs the whole model" in app.guide_text() and "then m" not in app.guide_text()
            promoted, app.promoted_count = app.promoted_count, 0  # with nothing promoted, m is not asked again
            assert app.rewritten and "then m" not in app.guide_text() and "g searches" in app.guide_text()
            app.promoted_count = promoted
            kinds = {e.signature.kind for e in manifest(Workspace.open(ws.root)).entries.values()}
            assert kinds == {"experts"}
            await pilot.press("b")
            await until(pilot, lambda: app.bench_outcome is not None or app.failures, 240, "the model run")
            assert not app.failures, [f.error for f in app.failures]
            assert app.bench_outcome.outputs_agree.get("eager+forge") is None
            # the workload generates: b measures its tokens/s next, in the same worker (awaited,
            # so that no thread runs torch while the process exits)
            await until(pilot, lambda: app.generation is not None or app.failures, 240, "the generation bench")
            assert not app.failures, [f.error for f in app.failures]
            assert any(line.startswith("  batch 1: prefill") for line in app.log_lines)
            app.rewriting = True  # while the worker runs, the guide says what it does
            assert "grouping routed experts" in app.guide_text()

    asyncio.run(scenario())


def module_card_of(app) -> str:
    return next(c.id for c in app.cards if c.kind == "module")


# ---- opening -------------------------------------------------------------------------------------
def test_op_table_sorts_filters_and_shows_the_card(profiled):
    async def scenario():
        app = ForgeApp(profiled.root)
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.screen.query_one(OpTable)
            await until(pilot, lambda: table.row_count > 0, 30, "the op table")
            await pilot.pause()
            cards = profiled.cards()
            assert table.row_count == len(cards)
            shares = [c.share or 0 for c in table.cards]
            assert shares == sorted(shares, reverse=True)
            detail = app.screen.query_one(CardDetail).query_one("#card-text")
            assert table.cards[0].id in text_of(detail)
            # which offline proposer serves the card, or in one line why none does (read in a worker)
            await until(pilot, lambda: "looking it up" not in text_of(detail), 60, "the offline kernel line")
            served = {c.id: text_of(detail) for c in table.cards[:1]}
            assert "offline kernel: " in served[table.cards[0].id]
            await pilot.press("down")
            await pilot.pause()
            assert table.cards[1].id in text_of(detail)
            await pilot.press("s")  # by time
            times = [c.time_us or 0 for c in table.cards]
            assert times == sorted(times, reverse=True) and table.sort_key == "time"
            await pilot.press("m")
            assert table.row_count == sum(c.kind == "module" for c in cards) == 1
            await pilot.press("c")  # chain cards only: this workload has none
            assert table.kind == "chain" and table.row_count == sum(c.kind == "chain" for c in cards) == 0
            await pilot.press("a", "slash", *"pow")
            assert [c.op_name for c in table.cards] == ["pow"] or all("pow" in c.id for c in table.cards)
            await pilot.press("escape")
            assert table.row_count == len(cards)
            # the light and the dark theme; the screens in the command palette
            dark = app.theme
            await pilot.press("ctrl+t")
            assert app.theme == "textual-light" != dark and not app.current_theme.dark
            await pilot.press("ctrl+t")
            assert app.current_theme.dark
            commands = {c.title: c for c in app.get_system_commands(app.screen)}
            assert {"Screen: Search", "Screen: Replay", "Search: start or resume", "Search: pause"} <= set(commands)
            commands["Screen: Approvals"].callback()
            await pilot.pause()
            assert isinstance(app.screen, ApprovalsScreen)

    asyncio.run(scenario())


def test_profiles_in_a_worker_then_shows_table(tmp_path, fast_config):
    async def scenario():
        app = ForgeApp(tmp_path / "fresh", workload="example:kb_softmax", device="cpu")
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.profiling, 5, "profiling")
            assert "profiling example:kb_softmax" in app.guide_text()
            table = app.screen.query_one(OpTable)
            await until(pilot, lambda: table.row_count >= 1, 120, "the op table")
            assert app.error is None and "g searches kernels" in app.guide_text()

    asyncio.run(scenario())


def test_bad_workspace_shows_error_without_crashing(tmp_path):
    async def scenario():
        app = ForgeApp(tmp_path / "nothing")
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.error, 10, "the error")
            assert "no workspace at" in app.error and app.guide_text().startswith("error:")
            await pilot.press("2", "1")

    asyncio.run(scenario())


def test_serve_command_drops_the_serve_flags():
    from forge_tui.ui.startup import serve_command

    cmd = serve_command(["ws", "--serve", "--port", "9000", "--proposer", "templates", "--host=0.0.0.0"])
    assert cmd.endswith("-m forge_tui.ui.startup ws --proposer templates")


# ---- describe an op ------------------------------------------------------------------------------
def test_describe_an_op_makes_a_card(profiled, tmp_path):
    """A scripted agent writes the reference; the screen shows it and its inputs; y adds the card to
    the workspace and the op table shows it."""
    from test_describe import DESCRIPTION, FIXED, SUMMARY, turn

    from forge_tui.agent.providers import ScriptedProvider
    from forge_tui.ui.describe_api import CoreDescriber

    ws_root = copy(profiled.root, tmp_path / "ws")
    cfg = tmp_path / "forge.toml"
    cfg.write_text(FAST_TOML + '\n[agent]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n')
    prov = ScriptedProvider([turn(("write_file", {"path": "reference.py", "content": FIXED}), ("try_reference", {})),
                             turn(("submit", {"summary": SUMMARY}))])
    before = len(profiled.cards())

    async def scenario():
        app = ForgeApp(ws_root, config=cfg, describer=CoreDescriber(ws_root, cfg, provider=prov))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.cards, 30, "the cards")
            await pilot.press("7", "y")  # nothing to accept yet: y is not taken
            screen = app.screen
            assert screen.draft is None
            await pilot.press("i", *DESCRIPTION, "enter")
            await until(pilot, lambda: screen.draft is not None or app.failures, 60, "the draft")
            assert not app.failures, [f.error for f in app.failures]
            assert screen.draft.ok and "F.gelu(" in screen.query_one("#describe-reference").text
            inputs = text_of(screen.query_one("#describe-inputs"))
            assert "[0]" in inputs and "[2]" in inputs and "64" in inputs, inputs
            await pilot.press("escape", "y")
            await until(pilot, lambda: len(app.cards) == before + 1 or app.failures, 120, "the new card")
            assert not app.failures, [f.error for f in app.failures]
            assert any(c.target == "module:LayerNormGELU" for c in app.cards)
            await pilot.press("1")
            await pilot.pause()
            assert app.screen.query_one(OpTable).row_count == before + 1

    asyncio.run(scenario())


def test_serve_answers_a_browser(profiled, tmp_path):
    """forge-tui --serve: textual-serve's page for the app, on a port of this machine."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "forge-tui"
    proc = subprocess.Popen([str(exe), str(profiled.root), "--serve", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        page = ""
        for _ in range(100):
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert "textual.js" in page and "forge-tui" in page
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_empty_approvals_queue_says_why_cards_are_not_offered():
    """No request waiting: the evidence pane lists the searched cards that have none, and why
    (``promotion.unrequested``), instead of an unexplained empty queue."""
    from ui_fixtures import RMS, FixtureBackend, FixtureDescriber

    backend = FixtureBackend()
    backend.rejected.append(RMS)
    backend.not_offered = [(RMS, "n0004 is correct, but the machine was too busy to trust its timing (calibration "
                                 "ran 2.1x its best)")]

    async def scenario():
        app = ForgeApp(Path("fixture"), backend=backend, describer=FixtureDescriber(), live_refresh=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")
            evidence = app.screen.query_one("#evidence-text")
            await until(pilot, lambda: "too busy" in text_of(evidence), 30, "the reasons")
            assert app.screen.query_one(RequestQueue).row_count == 0
            assert f"{RMS}: n0004 is correct" in text_of(evidence) and "t times the untimed kernels again" in \
                text_of(evidence)
            # t: forge retime in a worker; its lines reach the log and the screen reads the queue again
            await pilot.press("t")
            await until(pilot, lambda: app.screen.busy is None and backend.retimed == [RMS], 30, "the retime")
            assert f"retimed {RMS}: n0009 1.500x eager" in app.log_lines
            await until(pilot, lambda: "too busy" not in text_of(evidence), 30, "the queue read again")

    asyncio.run(scenario())
