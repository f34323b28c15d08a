"""The end-to-end result: ``forge bench``'s table (eager against eager + forge, outputs checked)."""

from __future__ import annotations

from textual.widgets import Static

from ...backend import BenchOutcome


class BenchResult(Static):
    DEFAULT_CSS = """
    BenchResult { height: auto; max-height: 10; padding: 0 1; border-top: solid $accent; }
    """

    def show(self, outcome: BenchOutcome | None, running: bool = False) -> None:
        if running:
            self.update("running the model: eager, then eager + forge (outputs compared) ...")
        elif outcome is None:
            self.update("end to end: not run yet (b runs the whole model with the promoted kernels)")
        else:
            self.update(outcome.table)
