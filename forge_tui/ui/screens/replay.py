"""Replay: any workspace's search history, stepped forward and back; the tree and every pane show
the state at that step (the state is the fold of the first k recorded events)."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input

from ...search.events import SearchEvent
from ..backend import Backend
from ..feed import ReplayFeed
from ..state import SearchState
from ..widgets.replay.scrubber import ReplayBar
from .search import TreeScreen


class ReplayLoaded(Message):
    def __init__(self, events: list[SearchEvent], source: str, backend: Backend) -> None:
        super().__init__()
        self.events = events
        self.source = source
        self.backend = backend


class ReplayScreen(TreeScreen):
    MODE = "replay"
    BINDINGS = [
        # priority: the tree would scroll sideways with them (they give way to the path box)
        Binding("right", "step(1)", "Step", priority=True),
        Binding("left", "step(-1)", "Back", priority=True),
        Binding("pagedown", "step(10)", "+10", show=False, priority=True),
        Binding("pageup", "step(-10)", "-10", show=False, priority=True),
        Binding("home", "jump(0)", "Start", show=False, priority=True),
        Binding("end", "jump(-1)", "End", show=False, priority=True),
        Binding("o", "open_workspace", "Open"),
        Binding("R", "reload", "Reload", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.feed = ReplayFeed([])
        self.source = ""
        self.replay_backend: Backend | None = None

    def compose_top(self) -> ComposeResult:
        yield ReplayBar(id="replay-bar")
        yield Input(placeholder="workspace to replay (Enter opens it, Escape cancels)", id="replay-path")

    def on_mount(self) -> None:
        self.query_one("#replay-path", Input).display = False
        self.load(self.forge.backend)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False, name="reading the history from git")
    def load(self, backend: Backend) -> None:
        events = backend.events()
        self.post_message(ReplayLoaded(events, str(backend.root), backend))

    def on_replay_loaded(self, message: ReplayLoaded) -> None:
        self.feed = ReplayFeed(message.events)
        self.source = message.source
        self.replay_backend = message.backend
        self._details.clear()
        self.feed.jump(-1)
        self._show()
        self.query_one("#search-tree").focus()

    def _show(self) -> None:
        state: SearchState = self.feed.state()
        self.show_state(state)
        self.query_one(ReplayBar).show(self.feed.step, len(self.feed.events), self.feed.current, self.source)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("step", "jump") and isinstance(self.focused, Input):
            return False
        return True

    def action_step(self, n: int) -> None:
        self.feed.move(n)
        self._show()

    def action_jump(self, k: int) -> None:
        self.feed.jump(k)
        self._show()

    def action_reload(self) -> None:
        self.load(self.replay_backend or self.forge.backend)

    def action_open_workspace(self) -> None:
        box = self.query_one("#replay-path", Input)
        box.display = True
        box.value = self.source
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "replay-path":
            return
        event.input.display = False
        path = Path(event.value.strip()).expanduser()
        backend = self.forge.backend if path == Path(self.forge.backend.root) else type(self.forge.backend)(path)
        self.load(backend)

    def key_escape(self) -> None:
        box = self.query_one("#replay-path", Input)
        if box.display:
            box.display = False
            self.query_one("#search-tree").focus()

    @work(thread=True, exclusive=True, group="node-detail", exit_on_error=False, name="reading the node from git")
    def load_detail(self, card: str, node: str) -> None:
        from ..messages import NodeDetailLoaded

        backend = self.replay_backend or self.forge.backend
        self.post_message(NodeDetailLoaded(backend.node_detail(card, node)))
