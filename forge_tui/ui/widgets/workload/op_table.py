"""The op table pane: a workspace's cards by share of the forward."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import DataTable

from ...cards import Card
from ...table import COLUMNS, cells, rows


class OpTable(DataTable):
    """Cards as rows; highlighting a row announces the card."""

    class CardHighlighted(Message):
        def __init__(self, card: Card) -> None:
            super().__init__()
            self.card = card

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cards: list[Card] = []

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show_cards(self, cards: list[Card]) -> None:
        self._cards = list(cards)
        self.clear()
        for row in rows(self._cards):
            self.add_row(*cells(row), key=row["card"])
        if self._cards:
            self.move_cursor(row=0)
            self.post_message(self.CardHighlighted(self._cards[0]))

    @property
    def cards(self) -> list[Card]:
        return self._cards

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._cards):
            self.post_message(self.CardHighlighted(self._cards[event.cursor_row]))
