"""The selected node's panes, as tabs: source, diff, errors, test results, ncu report, transcript.
The search screen and the replay screen show the same panes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static, TabbedContent, TabPane

from ...backend import NodeDetail
from .diff import DiffView
from .errors import BuildErrors
from .ncu import NcuReport
from .source import SourceView
from .tests import TestResults
from .transcript import TranscriptView

TABS = ("source", "diff", "errors", "tests", "ncu", "agent")


class NodePanes(Vertical):
    DEFAULT_CSS = """
    NodePanes { height: 1fr; }
    NodePanes > TabbedContent { height: 1fr; }
    NodePanes > TabbedContent > ContentSwitcher { height: 1fr; }
    NodePanes #node-title { height: auto; max-height: 2; padding: 0 1; background: $boost; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.detail: NodeDetail | None = None

    @property
    def active(self) -> str:
        return self.query_one(TabbedContent).active

    @active.setter
    def active(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="source"):
            with TabPane("Source", id="source"):
                yield Static("select a node in the tree", id="node-title")
                yield SourceView(id="source-view")
            with TabPane("Diff", id="diff"):
                yield DiffView()
            with TabPane("Errors", id="errors"):
                yield BuildErrors()
            with TabPane("Tests", id="tests"):
                yield TestResults()
            with TabPane("ncu", id="ncu"):
                yield NcuReport()
            with TabPane("Agent", id="agent"):
                yield TranscriptView()

    def show(self, detail: NodeDetail) -> None:
        self.detail = detail
        status = detail.result.status if detail.result is not None else ("reference" if detail.node == "root" else "?")
        parent = f" <- {detail.parent}" if detail.parent else ""
        self.query_one("#node-title", Static).update(f"{detail.card} {detail.node}{parent}: {status}")
        self.query_one(SourceView).show(detail.source or detail.missing, detail.language)
        self.query_one(DiffView).show(detail)
        self.query_one(BuildErrors).show(detail)
        self.query_one(TestResults).show(detail)
        self.query_one(NcuReport).show(detail)
        self.query_one(TranscriptView).show(detail)

    def on_build_errors_jump_to(self, event: BuildErrors.JumpTo) -> None:
        event.stop()
        self.goto(event.line)

    def goto(self, line: int) -> None:
        """The source tab, at this 1-based line (its start in sight), focused."""
        self.active = "source"
        view = self.query_one(SourceView)
        view.goto(line)
        view.focus()

    def focus_errors(self) -> None:
        """The errors list focused, its first diagnostic with a line highlighted: Enter shows it."""
        self.query_one(BuildErrors).focus_first()

    def show_first_error(self) -> bool:
        """The source at the first diagnostic's line (a build failure); False where none has one."""
        line = self.query_one(BuildErrors).first_line()
        if line is None:
            self.active = "errors"
            self.focus_errors()
            return False
        self.goto(line)
        return True
