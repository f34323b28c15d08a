"""The bridge from the core's typed events to Textual: one message carries one search event."""

from __future__ import annotations

from textual.message import Message

from ..search.events import SearchEvent


class SearchEventPosted(Message):
    """A search event (live from a running search, or rebuilt from git by a replay)."""

    def __init__(self, event: SearchEvent) -> None:
        super().__init__()
        self.event = event
