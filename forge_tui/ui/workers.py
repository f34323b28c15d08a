"""The cluster's workers in the app (``w``): each worker (host, device, busy or idle, evaluations
done, why it was refused) and the evaluations in flight (card, where, attempt, how long), live from
the cluster pool's events (``forge_tui.cluster.events``). Without a cluster it says the search runs
on this machine's pool.

``ClusterWatch`` is the app's one hook: it keeps the latest ``ClusterStatus`` (a replaceable
snapshot), publishes it on a signal, and puts worker changes in the event log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.signal import Signal
from textual.widgets import Static

from ..cluster.events import ClusterStatus, WorkerChanged
from ..search.events import SearchEvent

if TYPE_CHECKING:
    from .app import ForgeApp

STATE_STYLE = {"busy": "bold green", "idle": "dim", "refused": "bold red", "other": "dim italic"}


class ClusterWatch:
    def __init__(self, app: "ForgeApp") -> None:
        self.app = app
        self.status: ClusterStatus | None = None
        self.changed: Signal[ClusterStatus] = Signal(app, "cluster-changed")

    def apply(self, e: SearchEvent) -> None:
        if isinstance(e, ClusterStatus):
            if self.status is None:
                self.app.note(f"evaluating on the Dask cluster at {e.scheduler} (w shows its workers)")
            self.status = e
            self.changed.publish(e)
        elif isinstance(e, WorkerChanged):
            self.app.note(e.line())


def render_status(status: ClusterStatus | None) -> Table | Text:
    if status is None:
        return Text("No cluster: the search evaluates on this machine's pool "
                    "(forge search WS --cluster tcp://HOST:8786, or [pool] scheduler in forge.toml).")
    grid = Table.grid(padding=(0, 1))
    workers = Table(title=f"workers of {status.scheduler} ({status.backend})", expand=True)
    for col in ("worker", "host", "device", "state", "done"):
        workers.add_column(col, justify="right" if col == "done" else "left")
    for w in status.workers:
        state = Text(w.state + (f": {w.reason}" if w.reason else ""), style=STATE_STYLE.get(w.state, ""))
        workers.add_row(w.address, w.host, w.device, state, str(w.done))
    flight = Table(title=f"evaluations in flight ({len(status.in_flight)})", expand=True)
    for col in ("card", "worker", "attempt", "seconds"):
        flight.add_column(col, justify="right" if col in ("attempt", "seconds") else "left")
    for f in status.in_flight:
        flight.add_row(f.card, f.host or f.worker or "waiting for a worker", str(f.attempt), f"{f.seconds:.0f}")
    grid.add_row(workers)
    grid.add_row(flight)
    if status.pinned:
        grid.add_row(Text("timed on: " + "; ".join(f"{c} on {d}" for c, d in sorted(status.pinned.items()))))
    return grid


class WorkersView(Static):
    """The latest ``ClusterStatus``, redrawn when a new one comes."""

    def show(self, status: ClusterStatus | None) -> None:
        self.update(render_status(status))


class WorkersScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    WorkersScreen { align: center middle; }
    WorkersScreen > Vertical { width: 95%; height: auto; max-height: 90%; border: round $accent;
                               background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        Binding("escape,w", "dismiss", "Close")]

    def __init__(self, watch: ClusterWatch) -> None:
        super().__init__()
        self.watch_ = watch

    def compose(self) -> ComposeResult:
        with Vertical():
            yield WorkersView(id="workers")

    def on_mount(self) -> None:
        view = self.query_one(WorkersView)
        view.show(self.watch_.status)
        self.watch_.changed.subscribe(self, view.show)

    def action_dismiss(self, result: Any = None) -> None:  # type: ignore[override]
        self.dismiss(None)
