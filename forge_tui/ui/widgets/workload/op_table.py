"""The op table pane: a workspace's cards (card, kind, calls, share, time, floor, headroom, search
state, best speedup), sortable and filterable; space chooses the cards to search."""

from __future__ import annotations

from typing import Any, Callable

from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from ....cards import Card
from ...state import SearchState

# the live columns (search, best) come first: they stay in sight at 80 columns
COLUMNS = (("pick", "✓"), ("card", "card"), ("search", "search"), ("best", "best"), ("share", "share"),
           ("time", "µs/call"), ("calls", "calls"), ("kind", "kind"), ("floor", "floor µs"), ("headroom", "headroom"))
SORTS: dict[str, Callable[[Card], Any]] = {
    "share": lambda c: -(c.share or 0.0), "time": lambda c: -(c.time_us or 0.0), "calls": lambda c: -c.calls,
    "headroom": lambda c: -(c.headroom or 0.0), "card": lambda c: c.id, "kind": lambda c: (c.kind, -(c.share or 0.0)),
}


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


class OpTable(DataTable[str]):
    """Cards as rows; highlighting a row announces the card."""

    BINDINGS = [
        Binding("space", "pick", "Choose", tooltip="choose this card for the search (none chosen: every card)"),
        Binding("s", "sort", "Sort"),
    ]

    class CardHighlighted(Message):
        def __init__(self, card: Card) -> None:
            super().__init__()
            self.card = card

    class PicksChanged(Message):
        def __init__(self, picks: set[str]) -> None:
            super().__init__()
            self.picks = picks

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._all: list[Card] = []
        self._cards: list[Card] = []
        self.picks: set[str] = set()
        self.sort_key = "share"
        self.kind: str | None = None
        self.text = ""
        self._state: SearchState | None = None

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    # ---- what is shown -------------------------------------------------------------------------
    def show_cards(self, cards: list[Card]) -> None:
        self._all = list(cards)
        self._refill()

    def set_filter(self, kind: str | None = None, text: str | None = None) -> None:
        self.kind = kind
        if text is not None:
            self.text = text.strip().lower()
        self._refill()

    def _refill(self) -> None:
        keep = self._cards[self.cursor_row].id if self._cards and 0 <= self.cursor_row < len(self._cards) else None
        cards = [c for c in self._all if (self.kind is None or c.kind == self.kind)
                 and (not self.text or self.text in f"{c.id} {c.kind} {c.op_name} {c.label}".lower())]
        cards.sort(key=SORTS[self.sort_key])
        self._cards = cards
        self.clear()
        for c in cards:
            self.add_row(*self._cells(c), key=c.id)
        if cards:
            row = next((i for i, c in enumerate(cards) if c.id == keep), 0)
            self.move_cursor(row=row)
            self.post_message(self.CardHighlighted(cards[row]))

    def _cells(self, c: Card) -> list[str]:
        st = self._state.cards.get(c.id) if self._state else None
        search = "-" if st is None else ("skipped" if st.skipped else st.state)
        best = f"{st.best_speedup:.2f}x" if st is not None and st.best else "-"
        flags = "?" if "noisy_timing" in c.flags else ""
        return ["✓" if c.id in self.picks else " ", c.id, search, best, _fmt(c.share and 100 * c.share, ".1f", "%"),
                _fmt(c.time_us, ".1f") + flags, str(c.calls), c.kind, _fmt(c.floor_us, ".2f"), _fmt(c.headroom, ".1f", "x")]

    def show_state(self, state: SearchState) -> None:
        """The search and best columns, from the search's state."""
        self._state = state
        for c in self._cards:
            cells = self._cells(c)
            try:
                self.update_cell(c.id, "search", cells[2], update_width=True)
                self.update_cell(c.id, "best", cells[3], update_width=True)
            except Exception:  # noqa: BLE001 - a row gone while the table refilled
                pass

    @property
    def cards(self) -> list[Card]:
        return self._cards

    @property
    def current(self) -> Card | None:
        return self._cards[self.cursor_row] if self._cards and 0 <= self.cursor_row < len(self._cards) else None

    # ---- actions -------------------------------------------------------------------------------
    def action_pick(self) -> None:
        c = self.current
        if c is None:
            return
        self.picks ^= {c.id}
        self.update_cell(c.id, "pick", "✓" if c.id in self.picks else " ")
        self.post_message(self.PicksChanged(set(self.picks)))

    def action_sort(self) -> None:
        keys = list(SORTS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.notify(f"sorted by {self.sort_key}", timeout=2)
        self._refill()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._cards):
            self.post_message(self.CardHighlighted(self._cards[event.cursor_row]))
