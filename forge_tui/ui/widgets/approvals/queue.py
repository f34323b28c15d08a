"""The approvals queue: one promotion request per card (its best node, not yet decided)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message
from textual.widgets import DataTable

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

    def on_mount(self) -> None:
        self.add_column("card", width=24)  # fixed: the first rows otherwise come in at the header's width
        self.add_column("node", width=5)
        self.add_columns("vs eager", "spread", "vs compile", "sets")

    def show(self, requests: "list[Request]") -> None:
        self.requests = list(requests)
        self.clear()
        for r in self.requests:
            ev = r.evidence
            spread = "-" if ev.spread is None else f"{100 * ev.spread:.0f}%"
            self.add_row(r.card.id, r.node, _x(ev.speedup_vs_eager), spread, _x(ev.speedup_vs_compile),
                         str(len(ev.input_sets)), key=r.card.id)
        self.post_message(self.RequestHighlighted(self.requests[0] if self.requests else None))

    @property
    def current(self) -> "Request | None":
        return self.requests[self.cursor_row] if self.requests and 0 <= self.cursor_row < len(self.requests) else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(self.RequestHighlighted(self.current))
