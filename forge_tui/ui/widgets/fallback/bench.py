"""The end-to-end result: ``forge bench``'s table (eager against eager + forge, outputs checked),
its ratio the two medians it shows, the Amdahl bound of the served cards; scrollable."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...backend import BenchOutcome


class BenchResult(VerticalScroll):
    DEFAULT_CSS = """
    BenchResult { height: 1fr; padding: 0 1; border-top: solid $accent; }
    BenchResult > Static { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="bench-text", markup=False)

    def show(self, outcome: BenchOutcome | None, running: bool = False) -> None:
        text = self.query_one("#bench-text", Static)
        if running:
            text.update("running the model: eager, then eager + forge (outputs compared) ...")
        elif outcome is None:
            text.update("end to end: not run yet (b runs the whole model with the promoted kernels)")
        else:
            text.update(outcome.render())
