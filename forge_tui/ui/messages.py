"""The bridge from the core to Textual: typed messages. A feed (a live search, or the same events
rebuilt from git) posts ``SearchEventPosted``; workers post the others; widgets bind to them.
A crash anywhere in a worker arrives as ``Failed``, shown in the app, never a dead app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

from ..search.events import SearchEvent

if TYPE_CHECKING:
    from ..cards import Card
    from ..profiler.retime import CardRetime
    from ..promotion import Request
    from ..runtime.manifest import Entry
    from .backend import BenchOutcome, NodeDetail, RewriteOutcome


class SearchEventPosted(Message):
    """A search event (live from a running search, or rebuilt from git by a replay)."""

    def __init__(self, event: SearchEvent) -> None:
        super().__init__()
        self.event = event


class Progress(Message):
    """One line of progress from long work (profiling, building, benchmarking)."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class Failed(Message):
    """Work in a worker failed or crashed: where, and what (the app goes on)."""

    def __init__(self, where: str, error: str, detail: str = "") -> None:
        super().__init__()
        self.where = where
        self.error = error
        self.detail = detail


class CardsLoaded(Message):
    """A workspace's cards, and its recorded search (None: keep the state the app has)."""

    def __init__(self, cards: "list[Card]", title: str, events: list[SearchEvent] | None = None,
                 offline: dict[str, str] | None = None, generation: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.cards = cards
        self.title = title
        self.events = events
        self.offline = offline or {}
        """Card id -> which offline kernel serves it, or why none (the card pane's line)."""
        self.generation = generation
        """The workspace's last ``forge bench --generate`` result (``generation_result.py``), or None."""


class SearchFinished(Message):
    def __init__(self, stopped: str, paused: bool = False) -> None:
        super().__init__()
        self.stopped = stopped
        self.paused = paused


class NodeDetailLoaded(Message):
    def __init__(self, detail: "NodeDetail") -> None:
        super().__init__()
        self.detail = detail


class RequestsLoaded(Message):
    def __init__(self, requests: "list[Request]", promoted: "list[Entry]",
                 not_offered: "list[tuple[str, str]] | None" = None) -> None:
        super().__init__()
        self.requests = requests
        self.promoted = promoted
        self.not_offered = not_offered or []
        """(card, why) for searched cards with no request (``promotion.unrequested``)."""


class RuntimeStatusRead(Message):
    def __init__(self, status: dict[str, Any] | None, promoted: "list[Entry]") -> None:
        super().__init__()
        self.status = status
        self.promoted = promoted


class RewritesDone(Message):
    """``forge fold``, ``forge experts`` and ``forge merge`` ran on the workspace's model."""

    def __init__(self, outcome: "RewriteOutcome") -> None:
        super().__init__()
        self.outcome = outcome


class GenerationStarted(Message):
    """The model run (``b``) measures tokens per second next: the workload generates."""


class GenerationBenched(Message):
    """``forge bench --generate``'s result as stored in the workspace (``generation_result.py``)."""

    def __init__(self, result: dict[str, Any] | None) -> None:
        super().__init__()
        self.result = result


class BenchDone(Message):
    def __init__(self, outcome: "BenchOutcome") -> None:
        super().__init__()
        self.outcome = outcome


class RetimeFinished(Message):
    """The rounds of timing untimed kernels again ended, and why."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why


class CardsRetimed(Message):
    """A try at timing the profile's untrusted cards again (``profiler.retime``)."""

    def __init__(self, outcome: "CardRetime") -> None:
        super().__init__()
        self.outcome = outcome
