"""The diff pane: what a node changed against its parent (``git diff`` between their branches)."""

from __future__ import annotations

from rich.syntax import Syntax
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...backend import NodeDetail


class DiffView(VerticalScroll):
    DEFAULT_CSS = """
    DiffView { height: 1fr; }
    DiffView > Static { width: auto; padding: 0 1; }
    """

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static("no node selected", id="diff-text")

    def show(self, detail: NodeDetail) -> None:
        text = self.query_one("#diff-text", Static)
        if detail.node == "root":
            text.update("the root is the eager reference: it has no parent")
        elif not detail.diff.strip():
            text.update(detail.missing or "no change against the parent")
        else:
            text.update(Syntax(detail.diff, "diff", theme="ansi_dark", background_color="default", word_wrap=False))
        self.scroll_home(animate=False)
