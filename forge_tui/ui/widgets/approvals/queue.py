"""The approvals queue: one promotion request per card (its best node, not yet decided)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message
from textual.widgets import DataTable

from ....table import display_name
from ..workload.op_table import fit

NAME_WIDTH = 22

if TYPE_CHECKING:
    from ....promotion import Request


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


class RequestQueue(DataTable[str]):
    DEFAULT_CSS = """
    RequestQueue { height: 1fr; }
    """

    class RequestHighlighted(Message):
        def __init__(self, request: "Request | None") -> None:
            super().__init__()
            self.request = request

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.requests: list[Request] = []

    def show(self, requests: "list[Request]") -> None:
        """The requests, every column sized to what it holds, the card's name cut at
        ``NAME_WIDTH`` so that its speedup stays in sight at 80 columns (the evidence pane has the
        rest: the card's id, torch.compile, the input sets)."""
        self.requests = list(requests)
        rows = [(fit(display_name(r.card), NAME_WIDTH), _x(r.evidence.speedup_vs_eager),
                 "-" if r.evidence.spread is None else f"{100 * r.evidence.spread:.0f}%", r.node) for r in self.requests]
        self.clear(columns=True)
        for i, label in enumerate(("card", "vs eager", "spread", "node")):
            self.add_column(label, width=max([len(label), *(len(row[i]) for row in rows)]), key=label)
        for r, row in zip(self.requests, rows):
            self.add_row(*row, key=r.card.id)
        self.post_message(self.RequestHighlighted(self.requests[0] if self.requests else None))

    @property
    def current(self) -> "Request | None":
        return self.requests[self.cursor_row] if self.requests and 0 <= self.cursor_row < len(self.requests) else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(self.RequestHighlighted(self.current))
