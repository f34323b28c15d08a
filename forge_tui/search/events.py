"""Plain events the search emits; the TUI and the CLI subscribe. The core imports no Textual.

Persistent events are facts recorded in git (``forge replay`` rebuilds them, in the same order);
transient ones (``node_started``, ``budget_spent``) report progress and are not replayed.
``store_damaged`` (transient) reports a recorded item the search skipped or read in part; its data
is a :class:`~forge_tui.search.store.Damage` as JSON (``ref``, ``what``, ``commit``, ``skipped``, ...).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Callable

PERSISTENT = ("search_started", "node_added", "best_improved", "card_finished", "proposer_failed",
              "promotion_requested", "search_stopped")
TRANSIENT = ("node_started", "budget_spent", "store_damaged")


@dataclass(frozen=True)
class Event:
    kind: str
    seq: int
    card: str | None = None
    node: str | None = None
    data: dict = field(default_factory=dict)

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT

    def to_json(self) -> dict:
        return asdict(self)


class EventBus:
    """Synchronous fan-out; subscribers must be quick (the TUI posts a message and returns)."""

    def __init__(self) -> None:
        self._subs: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(event)


class Recorder:
    """A subscriber that keeps every event (tests, the CLI's summary)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def persistent(self) -> list[Event]:
        return [e for e in self.events if e.persistent]
