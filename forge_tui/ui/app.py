"""``forge-tui``: the terminal app.

``forge-tui WORKSPACE`` opens a workspace; ``--workload FILE`` profiles first (in a worker thread,
with live progress); ``--search`` starts a search once the workspace is loaded (otherwise ``g``
does). ``forge-tui`` alone is the demo: it profiles the bundled CPU example into ``workspaces/demo``
the first time, then the guide line leads through search, approval, and the model run end to end.
``forge-tui --serve`` serves the same app to a browser (textual-serve). The command line and the
process's end are in ``startup``.

Architecture: a feed (a live search's event bus, or the events rebuilt from git for a replay)
posts typed messages (``messages.py``); the app folds live events into one ``SearchState`` and
publishes it on signals the panes subscribe to. Profiling, searching, reading git, approving and
running the model are Textual workers; a worker that fails becomes a ``Failed`` message (a line in
the event log and a notification), never a dead app.
"""

from __future__ import annotations

import asyncio
import threading
import time
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
from ..profiler.trust import distrust
from ..search.retime import untimed
from .backend import Backend, BenchOutcome
from .describe_api import Describer
from .executor import DaemonExecutor
from .feed import LiveFeed
from .messages import (
    BenchDone,
    CardsLoaded,
    CardsRetimed,
    Failed,
    GenerationBenched,
    GenerationStarted,
    Progress,
    RetimeFinished,
    RewritesDone,
    SearchEventPosted,
    SearchFinished,
)
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
    from ..profiler.retime import CardRetime
    from ..promotion import Request
    from ..runtime.manifest import Entry
    from ..search.runner import Search

RETIME_WAIT_S = (10.0, 20.0, 40.0, 60.0)
"""Seconds between rounds of timing untimed kernels again, round by round (the last repeats)."""
CARDS_WAIT_S = (20.0, 60.0)
"""Seconds between tries at timing the untrusted cards of the profile again (the last repeats)."""


def short_reason(reason: str) -> str:
    """The cause in a noisy verdict's reason, short ("the calibration workload ran 354.9x slower
    than its best"): what the guide shows while kernels wait for a quieter machine."""
    text = reason.split("timing: ", 1)[-1] if "timing: " in reason else reason
    for cut in (" (", "; ", ": the machine"):
        text = text.split(cut, 1)[0]
    return text.strip().rstrip(".:;") or "the machine was busy"


def rewrites_doing() -> str:
    """What the rewrites in the registry do, in the order ``m`` runs them: "folding batch norms
    into their convolutions, grouping routed experts and merging sibling linears"."""
    from ..rewrites import REWRITES

    doing = [r.doing for r in REWRITES.values()]
    return doing[0] if len(doing) == 1 else f"{', '.join(doing[:-1])} and {doing[-1]}"


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
        # the guide names these on every screen: they work on every screen
        Binding("g", "start_search", "Search", show=False),
        Binding("p", "pause_search", "Pause", show=False),
        Binding("x", "stop_search", "Stop", show=False),
        Binding("t", "retime", "Time again", show=False),
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
        self.describer: Describer | None = describer
        """None until the describe screen asks (``describer_for`` imports the LLM SDKs: seconds)."""
        self.live_refresh = live_refresh
        # what the panes show
        self.cards: list[Card] = []
        self.offline: dict[str, str] = {}
        """Card id -> which offline kernel serves it, or why none (read with the cards)."""
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
        self.generation: dict[str, Any] | None = None
        """The workspace's last ``forge bench --generate`` result (tokens/s), or None."""
        self.generating = False
        """The model run (``b``) is measuring tokens per second, its forward's result shown."""
        self.rewriting = False
        """``forge fold``, ``forge experts`` and ``forge merge`` are running on the model (``m``)."""
        self.rewritten = False
        """Whether they ran in this app: until then the guide suggests them before a search."""
        self.failures: list[Failed] = []
        self.budget: tuple[int, int] | None = None
        """(evaluations, evaluations per card) of one search run here (``Backend.budget``)."""
        # the search in progress
        self._search: Search | None = None
        self.search_running = False
        self.paused = False
        self.user_stopped = False
        self._dirty = False
        # untimed kernels timed again, round after round (``t``; after a search, by itself)
        self.retiming = False
        self.retime_round = 0
        self.retime_next: float | None = None
        """When the next round starts (monotonic), while the rounds wait for a quieter machine."""
        self.retime_auto = True
        """Whether a search's end starts the rounds by itself (x turns it off until t or g)."""
        self._retime_cancel = threading.Event()
        self._retime_wake = threading.Event()
        """Set by t (or x) during the wait between rounds: the next round starts now."""
        self.retime_waits = RETIME_WAIT_S
        self._retime_after_search = False
        # the profile's untrusted cards, timed again once the machine is quiet
        self.cards_retiming = False
        self.cards_busy: str | None = None
        self.cards_next: float | None = None
        self._cards_tries = 0
        self.cards_waits = CARDS_WAIT_S
        self.stopping = False
        # signals the panes subscribe to
        self.state_changed: Signal[SearchState] = Signal(self, "state-changed")
        self.cards_changed: Signal[list[Card]] = Signal(self, "cards-changed")
        self.guide_changed: Signal[str] = Signal(self, "guide-changed")
        self.log_added: Signal[str] = Signal(self, "log-added")
        self.bench_changed: Signal[object] = Signal(self, "bench-changed")
        self.requests_stale: Signal[object] = Signal(self, "requests-stale")
        self.cluster = ClusterWatch(self)
        self.cards_status_changed: Signal[object] = Signal(self, "cards-status-changed")

    # ---- start -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        from ..workspace import is_workspace

        asyncio.get_running_loop().set_default_executor(DaemonExecutor())
        self.set_interval(0.25, self._publish_state)
        self.set_interval(1.0, self._tick)
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
        if self.budget is None:
            self.budget = self.backend.budget(self.config_path, self.search_settings)
        self.post_message(CardsLoaded(cards, title, events, self.backend.offline_lines(cards), self.backend.generation()))
        if with_history:
            self.requests_worker()

    def reload_cards(self) -> None:
        self.load_worker(with_history=False)

    def on_cards_loaded(self, message: CardsLoaded) -> None:
        self.profiling = False
        self.cards = message.cards
        self.offline = message.offline
        if message.generation is not None or not self.generating:
            self.generation = message.generation
        self.sub_title = message.title
        if message.events is not None and not self.search_running and not self.retiming:
            self.state = SearchState.of(message.events)
            self.state.interrupted()
            if self.state.started is not None:
                self.note(f"recorded search: {self.state.summary()}")
        self.note(f"{len(self.cards)} cards in {self.backend.root}")
        self.cards_changed.publish(self.cards)
        self.state_changed.publish(self.state)
        self._guide()
        if self.autostart and not self.search_running and self.state.runs == 0:
            self.autostart = False
            self.action_start_search()
        self.cards_status_changed.publish(None)
        self._maybe_retime_cards()

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
        ended = state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED)
        if worker.group == "search" and ended:
            self.search_running = False
            self._search = None
            # a search that ran its course (not paused, not stopped) leaves its untimed kernels to
            # be timed again once the requests are read
            self._retime_after_search = state == WorkerState.SUCCESS and not self.paused and not self.user_stopped
            self.requests_worker()
            self._guide()
        if worker.group == "retime" and ended:
            self.retiming = False
            self.retime_next = None
            self._search = None
            self.requests_worker()
            self._guide()
        if worker.group == "bench" and ended:
            self.bench_running = self.generating = False
            self.bench_changed.publish(None)
            self._guide()
        if worker.group == "rewrites" and ended:
            self.rewriting = False
            self.requests_worker()
            self._guide()
        if worker.group == "cards-retime" and ended:
            self.cards_retiming = False
            self.cards_status_changed.publish(None)
            if state != WorkerState.SUCCESS:
                self._cards_later()

    # ---- what the guide says ------------------------------------------------------------------------
    def untimed_kernels(self) -> dict[str, list[str]]:
        """Per card, the kernels a busy machine left untimed that no retime has judged yet."""
        out = {}
        for cid, c in self.state.cards.items():
            nodes = sorted(c.nodes.values(), key=lambda n: n.seq)
            left = untimed((n.id, n.status, n.move) for n in nodes)
            if left:
                out[cid] = left
        return out

    def busy_reason(self) -> str:
        """Why the latest kernel timed on a busy machine was not trusted, short."""
        noisy = [n for c in self.state.cards.values() for n in c.nodes.values() if n.status == "noisy" and n.reason]
        return short_reason(max(noisy, key=lambda n: n.seq).reason) if noisy else "the machine was busy"

    def more_evals(self) -> int:
        """Evaluations that g adds to a search whose budget is spent (a run's own budget)."""
        return self.budget[0] if self.budget else 0

    def guide_text(self) -> str:
        """What to do next, from where the session stands; it always names a key that does
        something now (plain text: the guide shows it as it is, brackets and all)."""
        s = self.state
        if self.error:
            return f"error: {self.error[:200]} (q quits)"
        if self.profiling:
            return (f"profiling {self.workload}: every operator call becomes a card ... {self.progress_line[:80]} "
                    "(q quits)")
        if not self.cards:
            return "opening the workspace ... (q quits)"
        if self.search_running:
            return (f"searching ({s.evaluations} of {s.max_evals or '?'} evaluations): 2 shows the live tree, "
                    "p pauses, x stops")
        if self.retiming:
            n = sum(len(v) for v in self.untimed_kernels().values())
            what = f"{n} correct kernel(s)" if n else "the correct kernels"
            if self.retime_next is not None:
                left = max(0, round(self.retime_next - time.monotonic()))
                return (f"{what} timed on a busy machine ({self.busy_reason()}): timed again in {left} s "
                        f"(round {self.retime_round + 1}; t: now), x stops")
            return (f"timing {what} again, round {self.retime_round} (the machine was busy: {self.busy_reason()}); "
                    "2 shows them, x stops")
        if self.bench_running:
            return "running the whole model: eager, then eager + forge, outputs compared ... (q quits)"
        if self.rewriting:
            return f"{rewrites_doing()}: each checked against the model, then timed ... (q quits)"
        if self.bench_outcome is not None:
            return self.bench_outcome.guide() + ". 5 replays the search, 6 plots it, q quits"
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
        run = "3 then b runs the whole model with the promoted kernel(s)"
        if self.requests_pending:
            return (f"{self.requests_pending} kernel(s) beat eager: 4 shows the evidence, y approves one"
                    + (f"; {run}" if self.promoted_count else " (g searches on)"))
        further = f"g searches {self.more_evals()} more evaluations" if self.more_evals() else "g searches further"
        waiting = sum(len(v) for v in self.untimed_kernels().values())
        if waiting:
            return (f"{waiting} correct kernel(s) timed on a busy machine ({self.busy_reason()}): t times them again, "
                    f"{further}" + (f"; {run}" if self.promoted_count else ""))
        if self.promoted_count:
            return f"kernel(s) promoted: {run}, end to end"
        if self.requests_pending == 0:
            return f"no kernel beat eager yet: {further} (budgets: forge.toml [search])"
        return s.summary() + f"; {further}"

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

    def _tick(self) -> None:
        """Once a second: the countdowns the guide and the table's note show."""
        if self.retime_next is not None:
            self._guide()
        if self.cards_next is not None:
            self.cards_status_changed.publish(None)

    def set_picks(self, picks: set[str]) -> None:
        self.picks = set(picks)
        self._guide()

    def _search_settings(self) -> dict[str, Any]:
        """The settings of the next run: the app's own, and where the recorded evaluations have
        spent a budget, that budget raised by one run's worth (g searches further, always)."""
        settings = dict(self.search_settings)
        if self.state.runs and self.budget:
            evals, per_card = self.budget
            done = self.state.evaluations
            most = max((c.evals for c in self.state.cards.values()), default=0)
            settings["max_evals"] = max(int(settings.get("max_evals") or evals), done + evals)
            settings["evals_per_card"] = max(int(settings.get("evals_per_card") or per_card), most + per_card)
        return settings

    def action_start_search(self) -> None:
        if self.search_running:
            self.notify("a search is already running (p pauses, x stops)", severity="warning")
            return
        if self.retiming:
            self.notify("kernels are being timed again (x stops that first)", severity="warning")
            return
        if not self.cards:
            self.notify("no cards yet", severity="warning")
            return
        self.search_running = True
        self.paused = self.user_stopped = False
        self.retime_auto = True
        cards = sorted(self.picks) or None
        settings = self._search_settings()
        self.note("starting a search" + (f" on {', '.join(cards)}" if cards else " on every card") +
                  (f" (up to {settings['max_evals']} evaluations in all)" if "max_evals" in settings else "") + " ...")
        self.search_worker(cards, settings)
        self._guide()

    @work(thread=True, exclusive=True, group="search", exit_on_error=False, name="the search")
    def search_worker(self, cards: list[str] | None, settings: dict[str, Any]) -> None:
        feed = LiveFeed(self)
        try:
            with self.backend.search(settings=settings, cards=cards, bus=feed.bus,
                                     proposer=self.proposer, config=self.config_path) as (search, resume, why):
                self._search = search
                if self.stopping:
                    search.request_stop("the app quit")
                self.call_from_thread(self.note, why)
                summary = search.run(resume=resume)
        finally:
            feed.close()
        self.post_message(SearchFinished(summary.stopped, paused=self.paused))

    def on_search_finished(self, message: SearchFinished) -> None:
        self._publish_state()
        self.note(f"search {'paused' if message.paused else 'stopped'}: {message.stopped}")

    def action_pause_search(self) -> None:
        if self._search is None or not self.search_running:
            self.notify("no search is running (g starts one)", severity="warning")
            return
        self.paused = True
        self._search.request_stop("paused from the app")
        self.note("pausing: the evaluations in flight finish and are kept ...")

    def action_stop_search(self) -> None:
        if self.retiming:
            self._retime_cancel.set()
            self._retime_wake.set()
            self.retime_auto = False
            self.retime_next = None
            if self._search is not None:
                self._search.request_stop("stopped from the app")
            self.note("stopping the timing: the kernel being timed finishes and is kept (t times them again) ...")
            self._guide()
            return
        if self._search is None or not self.search_running:
            self.notify("no search is running", severity="warning")
            return
        self.paused = False
        self.user_stopped = True
        self._search.request_stop("stopped from the app")
        self.note("stopping: the evaluations in flight finish and are kept ...")

    # ---- untimed kernels, timed again ---------------------------------------------------------------
    def action_retime(self) -> None:
        """t: time again the kernels a busy machine left untimed, round after round, until each
        has a verdict, a kernel beats eager, or x stops it."""
        if self.retiming:
            if self.retime_next is not None:
                self._retime_wake.set()  # waiting between rounds: the next one now
            else:
                self.notify("already timing them again (x stops)", severity="warning")
            return
        if self.search_running or self.bench_running or self.generating or self.rewriting:
            self.notify("the model or a search is running: t waits for it (x stops a search)", severity="warning")
            return
        self.retime_auto = True
        self.start_retime()

    def start_retime(self) -> None:
        self.retiming = True
        self.retime_round = 0
        self.retime_next = None
        self._retime_cancel = threading.Event()
        self._retime_wake = threading.Event()
        self.note("timing again the correct kernels a busy machine left untimed (forge retime), until each has a "
                  "verdict; x stops")
        self.retime_worker(self._retime_cancel, self._retime_wake)
        self._guide()

    def _set_search(self, search: "Search") -> None:
        self._search = search
        if self._retime_cancel.is_set() or self.stopping:
            search.request_stop("stopped from the app")

    def _retime_round(self, k: int) -> None:
        self.retime_round = k
        self.retime_next = None
        self._guide()

    def _retime_wait(self, until: float) -> None:
        self.retime_next = until
        self._guide()

    @work(thread=True, exclusive=True, group="retime", exit_on_error=False, name="timing kernels again")
    def retime_worker(self, cancel: threading.Event, wake: threading.Event) -> None:
        feed = LiveFeed(self)
        why = "stopped from the app"
        try:
            k = 0
            while not cancel.is_set():
                k += 1
                self.call_from_thread(self._retime_round, k)
                lines = self.backend.retime(self.config_path, settings=self.search_settings, bus=feed.bus,
                                            on_search=lambda search: self.call_from_thread(self._set_search, search))
                for line in lines:
                    self.call_from_thread(self.note, line)
                if self.backend.requests():
                    why = "a kernel beat eager"
                    break
                if not self.backend.untimed():
                    why = "every kernel timed again has a verdict"
                    break
                if cancel.is_set():
                    break
                wait = self.retime_waits[min(k, len(self.retime_waits)) - 1]
                self.call_from_thread(self._retime_wait, time.monotonic() + wait)
                wake.wait(wait)
                wake.clear()
        finally:
            feed.close()
        self.post_message(RetimeFinished(why))

    def on_retime_finished(self, message: RetimeFinished) -> None:
        self._publish_state()
        self.note(f"timing again stopped: {message.why}")
        self.requests_stale.publish(None)

    # ---- the profile's untrusted cards, timed again ---------------------------------------------------
    def _busy_with_work(self) -> bool:
        return (self.profiling or self.search_running or self.retiming or self.bench_running or self.generating
                or self.rewriting or self.stopping)

    def _maybe_retime_cards(self, scheduled: bool = False) -> None:
        """Time the untrusted cards again once nothing else runs (a search or a model run is load
        of its own); otherwise, or while the machine is busy, try again later (``scheduled``: the
        timer of such a later try; until it fires, nothing else starts a try)."""
        if self.cards_retiming or not any(distrust(c) for c in self.cards):
            return
        if self.cards_next is not None and not scheduled:
            return
        if self._busy_with_work():
            self._cards_later()
            return
        self.cards_retiming = True
        self.cards_next = None
        self.cards_status_changed.publish(None)
        self.cards_retime_worker()

    def _cards_later(self) -> None:
        if self.stopping or not any(distrust(c) for c in self.cards):
            self.cards_next = None
            return
        wait = self.cards_waits[min(self._cards_tries, len(self.cards_waits) - 1)]
        self._cards_tries += 1
        self.cards_next = time.monotonic() + wait
        self.cards_status_changed.publish(None)
        self.set_timer(wait, lambda: self._maybe_retime_cards(scheduled=True))

    @work(thread=True, exclusive=True, group="cards-retime", exit_on_error=False, name="timing cards again")
    def cards_retime_worker(self) -> None:
        outcome = self.backend.retime_cards(stop=self._busy_with_work)
        self.post_message(CardsRetimed(outcome))

    def on_cards_retimed(self, message: CardsRetimed) -> None:
        outcome: CardRetime = message.outcome
        self.cards_retiming = False
        self.cards_busy = outcome.busy
        if outcome.retimed or outcome.forward_us is not None:
            self.note(outcome.line())
            self.reload_cards()
        if outcome.waiting:
            self._cards_later()
        else:
            self.cards_next = None
        self.cards_status_changed.publish(None)

    @property
    def cards_status(self) -> str:
        """The op table's note on its untrusted cards: what they rank by, and whether they are
        being timed again or when they will be (and why not now), in one sentence."""
        n = sum(1 for c in self.cards if distrust(c))
        if not n:
            return ""
        head = f"{n} card(s) marked ? were timed on a busy machine: they rank by bytes and FLOPs"
        if self.cards_retiming:
            return f"{head}; timing them again if the machine is quiet now ..."
        if self.cards_next is not None:
            left = max(0, round(self.cards_next - time.monotonic()))
            why = f"; now {short_reason(self.cards_busy)}" if self.cards_busy else ""
            return f"{head}, timed again when it is quiet (next try in {left} s{why})"
        return f"{head} until timed again on a quiet machine"

    # ---- promotion and the model run ---------------------------------------------------------------
    @work(thread=True, exclusive=True, group="requests", exit_on_error=False, name="reading the promotion requests")
    def requests_worker(self) -> None:
        reqs, promoted = self.backend.requests(), self.backend.promoted()
        self.call_from_thread(self.note_requests, reqs, promoted)

    def note_requests(self, requests: "list[Request]", promoted: "list[Entry]") -> None:
        self.requests_pending = len(requests)
        self.promoted_count = len(promoted)
        after, self._retime_after_search = self._retime_after_search, False
        if after and not requests and self.retime_auto and not self._busy_with_work() and self.untimed_kernels():
            # noise costs time, not the outcome: the correct kernels are timed again until a verdict
            self.start_retime()
        self._guide()
        self._maybe_retime_cards()

    def action_bench(self) -> None:
        if self.bench_running or self.generating:
            self.notify("the model is already running", severity="warning")
            return
        self.bench_running = True
        self.bench_changed.publish(None)
        self.note("running the model end to end (forge bench, without torch.compile) ...")
        self.bench_worker()
        self._guide()

    def action_rewrite(self) -> None:
        if self.rewriting or self.bench_running or self.generating:
            self.notify("the model is already running", severity="warning")
            return
        self.rewriting = True
        from ..rewrites import REWRITES

        self.note(f"{rewrites_doing()} ({', '.join(f'forge {name}' for name in REWRITES)}) ...")
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
        """The forward four ways' two (``Backend.bench``), then, where the workload generates, its
        tokens per second (``Backend.bench_generate``), each shown as it arrives."""
        from textual.worker import get_current_worker

        self.post_message(BenchDone(self.backend.bench()))
        if get_current_worker().is_cancelled or not self.backend.generates():
            return
        self.post_message(GenerationStarted())
        self.post_message(GenerationBenched(self.backend.bench_generate()))

    def on_generation_started(self, message: GenerationStarted) -> None:
        self.generating = True
        self.note("measuring tokens per second (forge bench --generate, without torch.compile) ...")
        self.bench_changed.publish(None)

    def on_generation_benched(self, message: GenerationBenched) -> None:
        from ..generation_result import tokens_lines

        self.generating = False
        if message.result is not None:
            self.generation = message.result
            for line in tokens_lines(message.result):
                self.note(line)
        self.bench_changed.publish(None)
        self._guide()

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
        """Quit at once: nothing is waited for here (the thread workers are daemons); the search
        in progress is told to stop, and ``finish`` ends what still runs once the app is gone."""
        self.stopping = True
        self._retime_cancel.set()
        self._retime_wake.set()
        if self._search is not None:
            self._search.request_stop("the app quit")
        self.exit()

    def release(self, timeout: float = 0.5) -> None:
        """After the app's end: the search in progress (or the kernels being timed again) abandoned,
        its last record written or never begun and its evaluations ended (``Search.abandon``)."""
        search = self._search
        if search is not None:
            search.abandon(timeout)
