"""What the cluster pool reports while a search runs: transient search events (never recorded in
git), published on the search's bus. The CLI prints their lines; the app renders them
(``forge_tui/ui/workers.py``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..search.events import SearchEvent


class WorkerView(BaseModel):
    """One Dask worker as the search sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str
    host: str = ""
    device: str = ""
    """The GPU's name and arch (cuda), or the CPU's model (cpu)."""
    state: Literal["idle", "busy", "refused", "other"] = "idle"
    """busy: running one of the search's evaluations; refused: cannot run them (``reason``);
    other: offers no resource of the search's backend."""
    reason: str = ""
    done: int = 0
    """The search's evaluations it finished."""


class EvalInFlight(BaseModel):
    """One evaluation submitted to the cluster and not yet back."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    card: str
    worker: str = ""
    """Where it runs now ("" while it waits for a worker)."""
    host: str = ""
    attempt: int = 1
    """1, then one more each time its worker died under it."""
    seconds: float = 0.0
    """Since it was submitted."""


class ClusterStatus(SearchEvent):
    """The workers and the evaluations in flight, published whenever either changes (a
    replaceable snapshot: a subscriber keeps only the latest)."""

    persistent: ClassVar[bool] = False
    kind: Literal["cluster_status"] = "cluster_status"
    scheduler: str = ""
    backend: str = ""
    workers: list[WorkerView] = Field(default_factory=list)
    in_flight: list[EvalInFlight] = Field(default_factory=list)
    pinned: dict[str, str] = Field(default_factory=dict)
    """Card -> the device its evaluations are timed on, where the cluster has several."""

    def line(self) -> str:
        usable = [w for w in self.workers if w.state in ("idle", "busy")]
        busy = sum(w.state == "busy" for w in usable)
        where = ", ".join(f"{e.card}@{e.host or e.worker or 'queued'}" + (f" (attempt {e.attempt})" if e.attempt > 1 else "")
                          for e in self.in_flight[:6])
        more = f" and {len(self.in_flight) - 6} more" if len(self.in_flight) > 6 else ""
        return (f"cluster {self.scheduler}: {busy}/{len(usable)} workers busy, "
                f"{sum(w.done for w in self.workers)} evaluations done; in flight: {where or 'none'}{more}")


class WorkerChanged(SearchEvent):
    """A worker joined, left, or was refused (with why)."""

    persistent: ClassVar[bool] = False
    kind: Literal["worker_changed"] = "worker_changed"
    address: str
    host: str = ""
    device: str = ""
    change: Literal["joined", "left", "refused"] = "joined"
    reason: str = ""

    def line(self) -> str:
        what = f"worker {self.address} on {self.host or '?'}" + (f" ({self.device})" if self.device else "")
        if self.change == "refused":
            return f"cluster: {what} refused: {self.reason}"
        return f"cluster: {what} {self.change}" + (f": {self.reason}" if self.reason else "")
