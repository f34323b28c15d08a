"""The nvcc errors pane: the compiler's diagnostics (nvcc, g++, ptxas, ld) and the static checks'
findings, parsed, one per line; Enter on one jumps to its line in the source pane."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ...backend import NodeDetail

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def diagnostics(detail: NodeDetail) -> list[tuple[int | None, str, str]]:
    """(line, severity, text) for every diagnostic of the node's build and static checks."""
    r = detail.result
    out: list[tuple[int | None, str, str]] = []
    if r is None:
        return out
    for f in r.static.findings if r.static else []:
        out.append((f.line, f.severity, f"static {f.rule}: {f.message}"))
    for d in r.build.diagnostics if r.build else []:
        where = f"{d.file}:{d.line}" + (f":{d.column}" if d.column is not None else "") if d.line else d.file
        out.append((d.line, d.severity, f"{where}: {d.message}"))
    return out


class BuildErrors(Vertical):
    DEFAULT_CSS = """
    BuildErrors { height: 1fr; }
    BuildErrors > #errors-summary { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    BuildErrors > OptionList { height: 1fr; border: none; }
    """

    class JumpTo(Message):
        """Show this 1-based line of the node's source."""

        def __init__(self, line: int) -> None:
            super().__init__()
            self.line = line

    def compose(self) -> ComposeResult:
        yield Static("no node selected", id="errors-summary")
        yield OptionList(id="errors-list")

    def show(self, detail: NodeDetail) -> None:
        items = diagnostics(detail)
        r = detail.result
        summary = self.query_one("#errors-summary", Static)
        options = self.query_one(OptionList)
        options.clear_options()
        if r is None:
            summary.update(detail.missing or ("the eager reference: nothing was built" if detail.node == "root"
                                              else "no evaluation recorded for this node"))
            return
        b = r.build
        head = "build: not reached" if b is None else (
            f"build: {'ok' if b.ok else 'FAILED'}" + (f" ({len(b.errors)} errors)" if b.errors else ""))
        if b is not None and not b.ok and b.reason:
            head += f": {b.reason.splitlines()[0][:200]}"
        n = sum(1 for line, _, _ in items if line)
        summary.update(head + (f"\n{n} with a line: Enter shows it in the source" if n else ""))
        for i, (line, sev, text) in enumerate(items):
            label = Text.assemble((f"{sev:7s} ", SEVERITY_STYLE.get(sev, "")), text)
            options.add_option(Option(label, id=f"d{i}-{line or 0}"))
        if not items and b is not None and not b.ok and b.log:
            for i, raw in enumerate(b.log.splitlines()[-40:]):
                options.add_option(Option(Text(raw), id=f"log{i}-0"))

    def first_line(self) -> int | None:
        """The first diagnostic's line, where one has a line."""
        options = self.query_one(OptionList)
        for i in range(options.option_count):
            line = int(str(options.get_option_at_index(i).id).rsplit("-", 1)[1])
            if line:
                return line
        return None

    def focus_first(self) -> None:
        options = self.query_one(OptionList)
        if options.option_count:
            first = next((i for i in range(options.option_count)
                          if int(str(options.get_option_at_index(i).id).rsplit("-", 1)[1])), 0)
            options.highlighted = first
            options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        line = int(str(event.option.id).rsplit("-", 1)[1])
        if line:
            self.post_message(self.JumpTo(line))
