"""Feeds: where the app's search events come from. A live feed subscribes to a running search's
event bus and posts each event to the app as a Textual message (from the search's thread; Textual's
``post_message`` is thread-safe). A replay feed holds the events rebuilt from git and a cursor; the
state at a step is the fold of the events before it, the same fold the live feed's events get.
"""

from __future__ import annotations

from typing import Callable

from textual.message_pump import MessagePump

from ..search.events import EventBus, SearchEvent
from .messages import SearchEventPosted
from .state import SearchState


class LiveFeed:
    def __init__(self, target: MessagePump) -> None:
        self.target = target
        self.bus = EventBus()
        self._unsubscribe: Callable[[], None] = self.bus.subscribe(self._post)

    def _post(self, event: SearchEvent) -> None:
        self.target.post_message(SearchEventPosted(event))

    def close(self) -> None:
        self._unsubscribe()


class ReplayFeed:
    def __init__(self, events: list[SearchEvent]) -> None:
        self.events = list(events)
        self.step = 0
        """How many events are shown (0: none, len(events): all)."""
        self._cache: dict[int, SearchState] = {}

    @property
    def current(self) -> SearchEvent | None:
        return self.events[self.step - 1] if self.step > 0 else None

    def move(self, n: int) -> int:
        self.step = max(0, min(len(self.events), self.step + n))
        return self.step

    def jump(self, k: int) -> int:
        self.step = len(self.events) if k < 0 else max(0, min(len(self.events), k))
        return self.step

    def state(self) -> SearchState:
        if self.step not in self._cache:
            self._cache[self.step] = SearchState.of(self.events[: self.step])
        return self._cache[self.step]
