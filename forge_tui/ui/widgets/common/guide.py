"""The guide line: what to do next, from where the session stands (profile, search, approve,
apply, end-to-end result), so that a newcomer never needs the README to find the next key. Shown
as plain text: a bracket in it (``forge.toml [search]``) is a bracket, not markup."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class Guide(Static):
    DEFAULT_CSS = """
    Guide { height: auto; max-height: 3; padding: 0 1; background: $accent 30%; color: $text; }
    """

    def on_mount(self) -> None:
        app = self.app
        self.show(getattr(app, "guide_text", lambda: "")())
        signal = getattr(app, "guide_changed", None)
        if signal is not None:
            signal.subscribe(self, self.show)

    def show(self, text: str) -> None:
        self.update(Text(text))

    @property
    def text(self) -> str:
        """What it shows (its visual's text, as drawn)."""
        return str(self.visual)
