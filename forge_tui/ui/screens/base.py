"""What every screen shares: the app it belongs to, and its workers' fates reported to the app
(a worker's state change does not bubble: a failure would otherwise go unseen)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen
from textual.worker import Worker

if TYPE_CHECKING:
    from ..app import ForgeApp


class ForgeScreen(Screen[None]):
    @property
    def forge(self) -> "ForgeApp":
        return self.app  # type: ignore[return-value]

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.forge.worker_changed(event.worker, event.state)
