"""The event log: the search's events, one line each (wrapped to the pane's width), and every
failure of the app's work."""

from __future__ import annotations

from textual.widgets import RichLog


class EventLog(RichLog):
    DEFAULT_CSS = """
    EventLog { height: 1fr; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(wrap=True, min_width=20, markup=False, highlight=False, max_lines=2000, **kwargs)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        app = self.app
        for line in getattr(app, "log_lines", [])[-200:]:
            self.write(line)
        signal = getattr(app, "log_added", None)
        if signal is not None:
            signal.subscribe(self, self.write)
