"""The replay bar: where in the history the screens stand, and the event at that step."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ....search.events import SearchEvent


class ReplayBar(Static):
    DEFAULT_CSS = """
    ReplayBar { height: 2; padding: 0 1; background: $boost; }
    """

    def show(self, step: int, total: int, event: SearchEvent | None, source: str) -> None:
        width = 30
        filled = 0 if total == 0 else int(round(width * step / total))
        bar = Text.assemble(("█" * filled, "green"), ("░" * (width - filled), "dim"))
        head = Text.assemble(("replay ", "bold"), f"step {step} of {total} ", bar, f"  {source}")
        line = event.line().strip() if event is not None else "the start: nothing recorded yet"
        self.update(Text.assemble(head, "\n", (line[:200], "")))
