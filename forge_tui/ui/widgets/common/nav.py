"""The strip of screens at the top: each screen's key, the current one highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SCREENS = (("1", "workload", "Workload"), ("2", "search", "Search"), ("3", "fallback", "Fallback"),
           ("4", "approvals", "Approvals"), ("5", "replay", "Replay"), ("6", "plots", "Plots"),
           ("7", "describe", "Describe"))


class NavBar(Static):
    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; color: $text-muted; }
    """

    def __init__(self, current: str, **kwargs: object) -> None:
        super().__init__(strip(current), **kwargs)  # type: ignore[arg-type]
        self.current = current


def strip(current: str) -> Text:
    t = Text.assemble(("forge ", "bold"))
    for key, mode, name in SCREENS:
        style = "bold reverse" if mode == current else ""
        t.append(f" {key} ", style="bold")
        t.append(name, style=style)
    return t
