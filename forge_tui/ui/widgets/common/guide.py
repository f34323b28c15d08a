"""The guide line: what to do next, from where the session stands (profile, search, approve,
apply, end-to-end result), so that a newcomer never needs the README to find the next key."""

from __future__ import annotations

from textual.widgets import Static


class Guide(Static):
    DEFAULT_CSS = """
    Guide { height: auto; max-height: 2; padding: 0 1; background: $accent 30%; color: $text; }
    """

    def on_mount(self) -> None:
        app = self.app
        self.update(getattr(app, "guide_text", lambda: "")())
        signal = getattr(app, "guide_changed", None)
        if signal is not None:
            signal.subscribe(self, self.update)
