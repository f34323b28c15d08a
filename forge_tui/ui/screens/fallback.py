"""Fallback status: per promoted card, kernel active or disabled and why, calls served and fallen
back with their reasons, re-read every second from the runtime's status.json while a model runs
(``forge bench``, an applied model, or ``b`` here); and the end-to-end result, with the tokens per
second of the last ``forge bench --generate`` where the workload generates (``b`` measures them
too). ``m`` runs ``forge fold``, ``forge experts`` and ``forge merge`` on the model first (batch
norms folded, routed experts grouped, sibling linears merged)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer

from ..messages import RuntimeStatusRead
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from ..widgets.fallback.bench import BenchResult
from ..widgets.fallback.status_table import RuntimeStatus
from .base import ForgeScreen


class FallbackScreen(ForgeScreen):
    BINDINGS = [
        Binding("b", "app.bench", "Run the model"),
        Binding("m", "app.rewrite", "Fold, group, merge"),
        Binding("r", "refresh_status", "Refresh", show=False),
    ]
    REFRESH_S = 1.0

    def compose(self) -> ComposeResult:
        yield NavBar("fallback")
        yield Guide()
        yield RuntimeStatus()
        yield BenchResult()
        yield Footer()

    def on_mount(self) -> None:
        self._show_bench()
        self.forge.bench_changed.subscribe(self, lambda _: self._show_bench())
        self.action_refresh_status()
        if self.forge.live_refresh:
            self.set_interval(self.REFRESH_S, self.action_refresh_status)

    def _show_bench(self) -> None:
        app = self.forge
        self.query_one(BenchResult).show(app.bench_outcome, app.bench_running, app.generation, app.generating)

    def action_refresh_status(self) -> None:
        self.read_status()

    @work(thread=True, exclusive=True, group="runtime-status", exit_on_error=False, name="reading the runtime status")
    def read_status(self) -> None:
        backend = self.forge.backend
        self.post_message(RuntimeStatusRead(backend.runtime_status(), backend.promoted()))

    def on_runtime_status_read(self, message: RuntimeStatusRead) -> None:
        self.query_one(RuntimeStatus).show(message.status, message.promoted)
