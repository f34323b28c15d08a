"""``forge-tui``: the terminal app.

``forge-tui WORKSPACE`` opens a workspace; ``--workload FILE`` profiles first (in a worker thread,
with live progress); ``--search`` starts a search once the workspace is loaded (otherwise ``g``
does). ``forge-tui`` alone is the demo: it profiles the bundled CPU example into ``workspaces/demo``
the first time, then the guide line leads through search, approval, and the model run end to end.
``forge-tui --serve`` serves the same app to a browser (textual-serve).

Architecture: a feed (a live search's event bus, or the events rebuilt from git for a replay)
posts typed messages (``messages.py``); the app folds live events into one ``SearchState`` and
publishes it on signals the panes subscribe to. Profiling, searching, reading git, approving and
running the model are Textual workers; a worker that fails becomes a ``Failed`` message (a line in
the event log and a notification), never a dead app.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.signal import Signal
from textual.worker import Worker, WorkerState

from ..errors import ForgeError
from .backend import Backend, BenchOutcome
from .describe_api import Describer, describer_for
from .feed import LiveFeed
from .messages import BenchDone, CardsLoaded, Failed, Progress, RewritesDone, SearchEventPosted, SearchFinished
from .screens.approvals import ApprovalsScreen
from .screens.describe import DescribeScreen
from .screens.fallback import FallbackScreen
from .screens.plots import PlotsScreen
from .screens.replay import ReplayScreen
from .screens.search import SearchScreen
from .screens.workload import WorkloadScreen
from .state import SearchState
from .widgets.common.nav import SCREENS
from .workers import ClusterWatch, WorkersScreen

if TYPE_CHECKING:
    from ..cards import Card
    from ..promotion import Request
    from ..runtime.manifest import Entry
    from ..search.runner import Search

DEMO_WORKLOAD = "example:tiny_decoder"
DEMO_WORKSPACE = Path("workspaces") / "demo"
DEMO_SEARCH = {"max_evals": 12, "evals_per_card": 4, "parallel": 2, "top": 4}


class ForgeApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "forge-tui"
    MODES = {"workload": WorkloadScreen, "search": SearchScreen, "fallback": FallbackScreen,
             "approvals": ApprovalsScreen, "replay": ReplayScreen, "plots": PlotsScreen, "describe": DescribeScreen}
    DEFAULT_MODE = "workload"
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        *[Binding(key, f"mode('{mode}')", name, show=False) for key, mode, name in SCREENS],
        Binding("q", "quit", "Quit"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", show=False),
        Binding("w", "workers", "Cluster workers", show=False),
    ]

    def __init__(self, workspace: Path, workload: str | None = None, device: str | None = None,
                 dtype: str | None = None, config: Path | None = None, search: dict[str, Any] | None = None, *,
                 autostart: bool | None = None, proposer: str = "auto", backend: Backend | None = None,
                 describer: Describer | None = None, live_refresh: bool = True) -> None:
        super().__init__()
        self.workspace_path = Path(workspace)
        self.workload = workload
        self.device = device
        self.dtype = dtype
        self.config_path = config
        self.search_settings: dict[str, Any] = dict(search or {})
        self.autostart = (search is not None) if autostart is None else autostart
        self.proposer = proposer
        self.backend = backend or Backend(self.workspace_path)
        self.describer = describer or describer_for(self.workspace_path, config)
        self.live_refresh = live_refresh
        # what the panes show
        self.cards: list[Card] = []
        self.picks: set[str] = set()
        self.state = SearchState()
        self.log_lines: list[str] = []
        self.error: str | None = None
        self.profiling = False
        self.progress_line = ""
        self.requests_pending: int | None = None
        self.promoted_count = 0
        self.bench_outcome: BenchOutcome | None = None
        self.bench_running = False
        self.rewriting = False
        """``forge fold``, ``forge experts`` and ``forge merge`` are running on the model (``m``)."""
        self.rewritten = False
        """Whether they ran in this app: until then the guide suggests them before a search."""
        self.failures: list[Failed] = []
        # the search in progress
        self._search: Search | None = None
        self.search_running = False
        self.paused = False
        self._dirty = False
        # signals the panes subscribe to
        self.state_changed: Signal[SearchState] = Signal(self, "state-changed")
        self.cards_changed: Signal[list[Card]] = Signal(self, "cards-changed")
        self.guide_changed: Signal[str] = Signal(self, "guide-changed")
        self.log_added: Signal[str] = Signal(self, "log-added")
        self.bench_changed: Signal[object] = Signal(self, "bench-changed")
        self.requests_stale: Signal[object] = Signal(self, "requests-stale")
        self.cluster = ClusterWatch(self)

    # ---- start -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        from ..workspace import is_workspace

        self.set_interval(0.25, self._publish_state)
        if self.workload is not None and not is_workspace(self.workspace_path):
            self.profiling = True
            self.note(f"profiling {self.workload} into {self.workspace_path} ...")
            self.profile_worker()
        else:
            self.load_worker()
        self._guide()

    @work(thread=True, exclusive=True, group="profile", exit_on_error=False, name="profiling")
    def profile_worker(self) -> None:
        assert self.workload is not None
        self.backend.profile(self.workload, device=self.device, dtype=self.dtype, config=self.config_path,
                             progress=lambda line: None if self.post_message(Progress(line)) else None)
        self.post_message(Progress("profile written"))
        self.load_worker()

    @work(thread=True, exclusive=True, group="load", exit_on_error=False, name="opening the workspace")
    def load_worker(self, with_history: bool = True) -> None:
        cards = self.backend.cards()
        title = self.backend.title()
        events = self.backend.events() if with_history else None
        self.post_message(CardsLoaded(cards, title, events))
        if with_history:
            self.requests_worker()

    def reload_cards(self) -> None:
        self.load_worker(with_history=False)

    def on_cards_loaded(self, message: CardsLoaded) -> None:
        self.profiling = False
        self.cards = message.cards
        self.sub_title = message.title
        if message.events is not None and not self.search_running:
            self.state = SearchState.of(message.events)
            if self.state.started is not None:
                self.note(f"recorded search: {self.state.summary()}")
        self.note(f"{len(self.cards)} cards in {self.backend.root}")
        self.cards_changed.publish(self.cards)
        self.state_changed.publish(self.state)
        self._guide()
        if self.autostart and not self.search_running and self.state.runs == 0:
            self.autostart = False
            self.action_start_search()

    def on_progress(self, message: Progress) -> None:
        self.progress_line = message.line
        self.note(message.line)
        self._guide()

    # ---- the log, the guide, failures ----------------------------------------------------------
    def note(self, line: str) -> None:
        self.log_lines.append(line)
        self.log_added.publish(line)

    def on_failed(self, message: Failed) -> None:
        self.failures.append(message)
        if message.where in ("profiling", "opening the workspace"):
            self.error = message.error
            self.profiling = False
        self.note(f"error in {message.where}: {message.error}")
        if message.detail:
            for line in message.detail.rstrip().splitlines()[-6:]:
                self.note(f"    {line}")
        self.notify(message.error[:300], title=f"{message.where} failed", severity="error", timeout=8)
        self._guide()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.worker_changed(event.worker, event.state)

    def worker_changed(self, worker: Worker[Any], state: WorkerState) -> None:
        """A worker of the app or of a screen changed state: a failure becomes a ``Failed`` message."""
        if state == WorkerState.ERROR and worker.error is not None:
            err = worker.error
            text = str(err) if isinstance(err, ForgeError) else f"{type(err).__name__}: {err}"
            detail = "" if isinstance(err, ForgeError) else "".join(traceback.format_exception(err))
            self.post_message(Failed(worker.name or "work", text, detail))
        if worker.group == "search" and state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            self.search_running = False
            self._search = None
            self.requests_worker()
            self._guide()
        if worker.group == "bench" and state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            self.bench_running = False
            self.bench_changed.publish(None)
            self._guide()
        if worker.group == "rewrites" and state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            self.rewriting = False
            self.requests_worker()
            self._guide()

    def guide_text(self) -> str:
        s = self.state
        if self.error:
            return f"error: {self.error[:200]} (q quits)"
        if self.profiling:
            return f"profiling {self.workload}: every operator call becomes a card ... {self.progress_line[:80]}"
        if not self.cards:
            return "opening the workspace ..."
        if self.search_running:
            return (f"searching ({s.evaluations} of {s.max_evals or '?'} evaluations): 2 shows the live tree, "
                    "p pauses, x stops")
        if self.bench_running:
            return "running the whole model: eager, then eager + forge, outputs compared ..."
        if self.rewriting:
            return ("folding batch norms, grouping routed experts and merging sibling linears: each checked against the "
                    "model, then timed ...")
        if self.bench_outcome is not None:
            sp = self.bench_outcome.speedup
            bad = [k for k, v in self.bench_outcome.outputs_agree.items() if v and "forge" in k]
            got = f"{sp:.2f}x eager" if sp else "measured"
            off = self.bench_outcome.switched_off
            offs = f"; {len(off)} kernel(s) switched off, slower end to end (3 says why)" if off else ""
            return (f"end to end: eager + forge {got}, outputs " + ("DIFFER" if bad else "agree") + offs +
                    ". 5 replays the search, 6 plots it, q quits")
        if self.paused:
            return "paused: g resumes the search where it stopped (every finished node is kept)"
        if s.runs == 0:
            chosen = f"the {len(self.picks)} chosen cards" if self.picks else "every card"
            if self.promoted_count:
                return (f"g searches kernels for {chosen}; {self.promoted_count} card(s) promoted already: 3 then b "
                        "runs the whole model with them")
            first = ("" if self.rewritten else
                     "first 3 then m folds batch norms, groups experts, merges linears (the search skips what they "
                     "replace); ")
            return f"{first}g searches kernels for {chosen} (space chooses cards, Enter shows a card's tree)"
        more = f" (4: {self.requests_pending} more request(s))" if self.requests_pending else ""
        if self.promoted_count:
            return "kernel(s) promoted: 3 then b runs the whole model with them, end to end" + more
        if self.requests_pending:
            return (f"{self.requests_pending} kernel(s) beat eager: 4 shows the evidence, y approves one "
                    "(g searches on)")
        if self.requests_pending == 0:
            return "no kernel beat eager yet: g searches further (budgets: forge.toml [search])"
        return s.summary()

    def _guide(self) -> None:
        self.guide_changed.publish(self.guide_text())

    # ---- the live search -------------------------------------------------------------------------
    def on_search_event_posted(self, message: SearchEventPosted) -> None:
        e = message.event
        self.state.apply(e)
        self.cluster.apply(e)
        if e.persistent or e.kind in ("store_damaged", "agent_step"):
            self.note(e.line())
        self._dirty = True

    def _publish_state(self) -> None:
        if self._dirty:
            self._dirty = False
            self.state_changed.publish(self.state)
            self._guide()

    def set_picks(self, picks: set[str]) -> None:
        self.picks = set(picks)
        self._guide()

    def action_start_search(self) -> None:
        if self.search_running:
            self.notify("a search is already running (p pauses, x stops)", severity="warning")
            return
        if not self.cards:
            self.notify("no cards yet", severity="warning")
            return
        self.search_running = True
        self.paused = False
        cards = sorted(self.picks) or None
        self.note("starting a search" + (f" on {', '.join(cards)}" if cards else " on every card") + " ...")
        self.search_worker(cards)
        self._guide()

    @work(thread=True, exclusive=True, group="search", exit_on_error=False, name="the search")
    def search_worker(self, cards: list[str] | None) -> None:
        feed = LiveFeed(self)
        try:
            with self.backend.search(settings=self.search_settings, cards=cards, bus=feed.bus,
                                     proposer=self.proposer, config=self.config_path) as (search, resume, why):
                self._search = search
                self.call_from_thread(self.note, why)
                summary = search.run(resume=resume)
        finally:
            feed.close()
        self.post_message(SearchFinished(summary.stopped, paused=self.paused))

    def on_search_finished(self, message: SearchFinished) -> None:
        self._publish_state()
        self.note(f"search {'paused' if message.paused else 'stopped'}: {message.stopped}")

    def action_pause_search(self) -> None:
        if self._search is None:
            self.notify("no search is running (g starts one)", severity="warning")
            return
        self.paused = True
        self._search.request_stop("paused from the app")
        self.note("pausing: the evaluations in flight finish and are kept ...")

    def action_stop_search(self) -> None:
        if self._search is None:
            self.notify("no search is running", severity="warning")
            return
        self.paused = False
        self._search.request_stop("stopped from the app")
        self.note("stopping: the evaluations in flight finish and are kept ...")

    # ---- promotion and the model run ---------------------------------------------------------------
    @work(thread=True, exclusive=True, group="requests", exit_on_error=False, name="reading the promotion requests")
    def requests_worker(self) -> None:
        reqs, promoted = self.backend.requests(), self.backend.promoted()
        self.call_from_thread(self.note_requests, reqs, promoted)

    def note_requests(self, requests: "list[Request]", promoted: "list[Entry]") -> None:
        self.requests_pending = len(requests)
        self.promoted_count = len(promoted)
        self._guide()

    def action_bench(self) -> None:
        if self.bench_running:
            self.notify("the model is already running", severity="warning")
            return
        self.bench_running = True
        self.bench_changed.publish(None)
        self.note("running the model end to end (forge bench, without torch.compile) ...")
        self.bench_worker()
        self._guide()

    def action_rewrite(self) -> None:
        if self.rewriting or self.bench_running:
            self.notify("the model is already running", severity="warning")
            return
        self.rewriting = True
        self.note("folding batch norms into their convolutions, grouping routed experts and merging sibling linears "
                  "(forge fold, forge experts, forge merge) ...")
        self.rewrite_worker()
        self._guide()

    @work(thread=True, exclusive=True, group="rewrites", exit_on_error=False, name="rewriting the model")
    def rewrite_worker(self) -> None:
        self.post_message(RewritesDone(self.backend.rewrites()))

    def on_rewrites_done(self, message: RewritesDone) -> None:
        for line in message.outcome.lines:
            self.note(line)
        self.rewriting = False
        self.rewritten = True
        self.requests_stale.publish(None)
        self.requests_worker()
        self._guide()

    @work(thread=True, exclusive=True, group="bench", exit_on_error=False, name="running the model")
    def bench_worker(self) -> None:
        self.post_message(BenchDone(self.backend.bench()))

    def on_bench_done(self, message: BenchDone) -> None:
        self.bench_outcome = message.outcome
        for line in message.outcome.table.splitlines():
            self.note(line)
        self.bench_running = False
        self.bench_changed.publish(None)
        self.requests_stale.publish(None)
        self._guide()

    # ---- screens, theme, palette -------------------------------------------------------------------
    def action_mode(self, mode: str) -> None:
        self.switch_mode(mode)

    def show_card_tree(self, card: str) -> None:
        self.switch_mode("search")

        def focus() -> None:
            if isinstance(self.screen, SearchScreen):
                self.screen.focus_card(card)

        self.call_after_refresh(focus)

    def action_workers(self) -> None:
        self.push_screen(WorkersScreen(self.cluster))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, mode, name in SCREENS:
            yield SystemCommand(f"Screen: {name}", f"switch to the {name.lower()} screen (key {key})",
                                lambda mode=mode: self.switch_mode(mode))  # type: ignore[misc]
        yield SystemCommand("Search: start or resume", "search kernels for the chosen cards (g)", self.action_start_search)
        yield SystemCommand("Search: pause", "finish the evaluations in flight, then stop; g resumes (p)",
                            self.action_pause_search)
        yield SystemCommand("Search: stop", "stop the search (x)", self.action_stop_search)
        yield SystemCommand("Run the model end to end", "forge bench with the promoted kernels (b on Fallback)",
                            self.action_bench)
        yield SystemCommand("Toggle light/dark theme", "ctrl+t", self.action_toggle_theme)

    async def action_quit(self) -> None:
        if self._search is not None:
            self._search.request_stop("stopped from the app")
        self.exit()


def serve_command(argv: list[str]) -> str:
    """The command textual-serve runs for each browser session: this app, without --serve."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        if a == "--serve" or a.startswith(("--host=", "--port=")):
            continue
        args.append(a)
    return shlex.join([sys.executable, "-m", "forge_tui.ui.app", *args])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="forge-tui", description="forge-tui: the terminal app. With no arguments, "
                                f"opens the demo workspace ({DEMO_WORKSPACE}), profiling {DEMO_WORKLOAD} first.")
    p.add_argument("workspace", nargs="?", type=Path, help="workspace to open")
    p.add_argument("--workload", help="profile this workload into the workspace first (if it is not one yet)")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--dtype")
    p.add_argument("--config", type=Path)
    p.add_argument("--proposer", default="auto", help="auto (default), agent, templates or scripted:PLAN.json")
    p.add_argument("--search", action="store_true", help="start a search once the workspace is loaded")
    p.add_argument("--serve", action="store_true", help="serve the app to a browser (textual-serve)")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    if args.serve:
        from textual_serve.server import Server

        Server(serve_command(argv), host=args.host, port=args.port, title="forge-tui").serve()
        return 0
    workspace, workload = args.workspace, args.workload
    search: dict[str, Any] = {}
    if workspace is None:
        workspace = DEMO_WORKSPACE
        workload = workload or DEMO_WORKLOAD
        search = dict(DEMO_SEARCH)
    from ..workspace import Workspace, check_target

    try:
        if workload is None:
            Workspace.open(workspace)
        else:
            check_target(workspace)
    except ForgeError as err:
        print(f"forge-tui: error: {err}", file=sys.stderr)
        return err.exit_code
    app = ForgeApp(workspace, workload, args.device, args.dtype, args.config, search=search, autostart=args.search,
                   proposer=args.proposer)
    app.run()
    if app.error:
        print(f"forge-tui: error: {app.error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
