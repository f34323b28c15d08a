"""Describe an op: the description typed, then the generated reference and inputs to review."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Static, TextArea

from ...describe_api import Draft


class DescribeInput(Input):
    """The description box, its keys in the footer while it has the focus (the screen's keys
    type into it then)."""

    BINDINGS = [
        Binding("enter", "submit", "Ask the agent"),
        Binding("escape", "screen.leave_box", "Leave the box"),
    ]


class DescribeForm(Vertical):
    DEFAULT_CSS = """
    DescribeForm { height: 1fr; }
    DescribeForm > #describe-status { height: auto; padding: 0 1; color: $text-muted; }
    DescribeForm > #describe-inputs { height: auto; max-height: 5; padding: 0 1; }
    DescribeForm > TextArea { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield DescribeInput(placeholder='describe an op, e.g. "fused LayerNorm + GELU for (8192, 4096) bf16"',
                            id="describe-input")
        yield Static("", id="describe-status")
        yield Static("", id="describe-inputs")
        yield TextArea("", read_only=True, show_line_numbers=False, id="describe-reference")

    def status(self, text: str) -> None:
        self.query_one("#describe-status", Static).update(text)

    def show(self, draft: Draft | None) -> None:
        self.query_one("#describe-inputs", Static).update(
            "" if draft is None else f"inputs: {draft.inputs}" + (f"\n{draft.notes}" if draft.notes else ""))
        area = self.query_one("#describe-reference", TextArea)
        area.show_line_numbers = draft is not None and bool(draft.reference.strip())
        area.load_text("" if draft is None else draft.reference)
