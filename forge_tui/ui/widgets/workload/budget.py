"""Budgets: evaluations, wall time and money spent against their limits, with a progress bar."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from ...state import SearchState


class BudgetPanel(Horizontal):
    DEFAULT_CSS = """
    BudgetPanel { height: 1; padding: 0 1; }
    BudgetPanel > Label { width: auto; margin-right: 1; }
    BudgetPanel > ProgressBar { width: 24; }
    BudgetPanel > ProgressBar > Bar { width: 16; }
    BudgetPanel > #budget-rest { width: 1fr; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Label("evals", id="budget-label")
        yield ProgressBar(total=1, show_eta=False, id="budget-bar")  # no total: an animation
        yield Label("", id="budget-rest")

    def show(self, state: SearchState) -> None:
        bar = self.query_one("#budget-bar", ProgressBar)
        if state.max_evals:
            bar.update(total=state.max_evals, progress=min(state.evaluations, state.max_evals))
        rest = [text for name, _, _, text in state.budgets()]
        self.query_one("#budget-label", Label).update("evals")
        self.query_one("#budget-rest", Label).update("  ".join(rest))
