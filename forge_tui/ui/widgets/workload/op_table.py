"""The op table pane: a workspace's cards (a readable name, search state, best speedup, share,
time, headroom; calls, floor, id and kind where the width allows), sortable and filterable; space
chooses the cards to search.

Every column is sized from what it holds each time the rows change (and on a resize), so that a
row arriving after the first draw never renders at another width than its neighbours.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from ....cards import Card
from ....profiler.trust import rank_shares
from ....table import display_name, headroom_text, share_text, time_text
from ...state import SearchState

# (key, label, right-justified): always shown, in this order
COLUMNS = (("pick", "✓", False), ("card", "card", False), ("search", "search", False), ("best", "best", True),
           ("share", "share", True), ("time", "µs/call", True), ("headroom", "headroom", True))
OPTIONAL = (("id", "id", False), ("calls", "calls", True), ("floor", "floor µs", True), ("kind", "kind", False))
"""Shown where the width allows, in this order of preference."""
NAME_MIN = 14
"""The card column's narrowest width: names longer than the room left are cut with an ellipsis."""
SCROLLBAR = 2

SORTS: dict[str, Callable[[Card, dict[str, float]], Any]] = {
    # share: a card whose time is not trusted ranks by its bytes and FLOPs (``profiler.trust``)
    "share": lambda c, rank: (-rank.get(c.id, 0.0), c.id), "time": lambda c, rank: -(c.time_us or 0.0),
    "calls": lambda c, rank: -c.calls, "headroom": lambda c, rank: -(c.headroom or 0.0),
    "card": lambda c, rank: c.id, "kind": lambda c, rank: (c.kind, -rank.get(c.id, 0.0)),
}


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


class OpTable(DataTable[Any]):
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
        self._rank: dict[str, float] = {}
        self.picks: set[str] = set()
        self.sort_key = "share"
        self.kind: str | None = None
        self.text = ""
        self._state: SearchState | None = None
        self.layout_widths: tuple[tuple[str, int], ...] = ()
        """(column key, width) as shown now."""

    # ---- what is shown -------------------------------------------------------------------------
    def show_cards(self, cards: list[Card]) -> None:
        self._all = list(cards)
        self._rank = rank_shares(self._all)
        self._refill()

    def set_filter(self, kind: str | None = None, text: str | None = None) -> None:
        self.kind = kind
        if text is not None:
            self.text = text.strip().lower()
        self._refill()

    def cells(self, c: Card) -> dict[str, str]:
        """Every column's text for a card (the card column uncut)."""
        st = self._state.cards.get(c.id) if self._state else None
        search = "-" if st is None else st.state
        best = f"{st.best_speedup:.2f}x" if st is not None and st.best else "-"
        return {"pick": "✓" if c.id in self.picks else " ", "card": display_name(c), "search": search, "best": best,
                "share": share_text(c), "time": time_text(c), "headroom": headroom_text(c),
                "calls": str(c.calls), "floor": _fmt(c.floor_us, ".2f"), "id": c.id, "kind": c.kind}

    def _room(self) -> int:
        width = self.size.width or (self.app.size.width if self.is_attached else 80)
        return max(20, width - SCROLLBAR)

    def _plan(self, rows: list[dict[str, str]]) -> tuple[tuple[str, int], ...]:
        """The columns to show and their widths: every always-shown column at the width of its
        widest cell, the card column cut to the room left, then the optional ones that fit."""
        pad = 2 * self.cell_padding

        def need(key: str, label: str) -> int:
            return max([len(label), *(len(r[key]) for r in rows)])

        fixed = [(key, need(key, label)) for key, label, _ in COLUMNS]
        used = sum(w + pad for key, w in fixed if key != "card")
        room = self._room()
        card_w = dict(fixed)["card"]
        card_w = max(NAME_MIN, min(card_w, room - used - pad))
        plan = [(k, card_w if k == "card" else w) for k, w in fixed]
        used += card_w + pad
        for key, label, _ in OPTIONAL:
            w = need(key, label)
            if used + w + pad <= room:
                plan.append((key, w))
                used += w + pad
        return tuple(plan)

    def _refill(self) -> None:
        keep = self.current.id if self.current is not None else None
        cards = [c for c in self._all if (self.kind is None or c.kind == self.kind)
                 and (not self.text or self.text in f"{c.id} {c.kind} {c.op_name} {c.label} {display_name(c)}".lower())]
        cards.sort(key=lambda c: SORTS[self.sort_key](c, self._rank))
        self._cards = cards
        rows = [self.cells(c) for c in cards]
        plan = self._plan(rows)
        labels = {key: (label, right) for key, label, right in (*COLUMNS, *OPTIONAL)}
        if plan != self.layout_widths:
            self.clear(columns=True)
            for key, width in plan:
                label, right = labels[key]
                self.add_column(Text(label, justify="right" if right else "left"), width=width, key=key)
            self.layout_widths = plan
        else:
            self.clear()
        for c, row in zip(cards, rows):
            self.add_row(*self._render_row(row), key=c.id)
        if cards:
            at = next((i for i, c in enumerate(cards) if c.id == keep), 0)
            self.move_cursor(row=at, animate=False)
            self.post_message(self.CardHighlighted(cards[at]))

    def _render_row(self, row: dict[str, str]) -> list[Any]:
        right = {key for key, _, r in (*COLUMNS, *OPTIONAL) if r}
        out: list[Any] = []
        for key, width in self.layout_widths:
            text = fit(row[key], width)
            out.append(Text(text, justify="right") if key in right else text)
        return out

    def show_state(self, state: SearchState) -> None:
        """The search and best columns, from the search's state (every column sized again when a
        cell outgrows its column)."""
        self._state = state
        widths = dict(self.layout_widths)
        updates = []
        for c in self._cards:
            cells = self.cells(c)
            if len(cells["search"]) > widths.get("search", 0) or len(cells["best"]) > widths.get("best", 0):
                self._refill()
                return
            updates.append((c.id, cells))
        for cid, cells in updates:
            try:
                self.update_cell(cid, "search", cells["search"])
                self.update_cell(cid, "best", Text(cells["best"], justify="right"))
            except Exception:  # noqa: BLE001 - a row gone while the table refilled
                pass

    def on_resize(self, event: events.Resize) -> None:
        if self._cards:
            self._refill()

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
