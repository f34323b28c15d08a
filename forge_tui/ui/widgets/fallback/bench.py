"""The end-to-end result: ``forge bench``'s table (eager against eager + forge, outputs checked),
its ratio the two medians it shows, the Amdahl bound of the served cards; where the workload
generates, the prefill and decode tokens/s of the last ``forge bench --generate``; scrollable."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ....generation_result import tokens_lines
from ...backend import BenchOutcome


class BenchResult(VerticalScroll):
    DEFAULT_CSS = """
    BenchResult { height: 1fr; padding: 0 1; border-top: solid $accent; }
    BenchResult > Static { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="bench-text", markup=False)

    def show(self, outcome: BenchOutcome | None, running: bool = False, generation: dict[str, Any] | None = None,
             generating: bool = False) -> None:
        text = self.query_one("#bench-text", Static)
        if running:
            forward = "running the model: eager, then eager + forge (outputs compared) ..."
        elif outcome is None:
            forward = "end to end: not run yet (b runs the whole model with the promoted kernels)"
        else:
            forward = outcome.render()
        parts = [forward]
        if generating:
            parts.append("measuring tokens per second: eager, then eager + forge (forge bench --generate) ...")
        elif generation is not None:
            parts.append("\n".join(tokens_lines(generation)))
        text.update("\n\n".join(parts))
