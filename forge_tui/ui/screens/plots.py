"""Plots: best speedup over evaluations per card, and cost against speedup."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Footer

from ..state import SearchState
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from ..widgets.plots.cost import CostPlot
from ..widgets.plots.speedup import SpeedupPlot
from .base import ForgeScreen


class PlotsScreen(ForgeScreen):
    def compose(self) -> ComposeResult:
        yield NavBar("plots")
        yield Guide()
        with Horizontal(id="plots-main"):
            yield SpeedupPlot(id="speedup-plot")
            yield CostPlot(id="cost-plot")
        yield Footer()

    def on_mount(self) -> None:
        self.forge.state_changed.subscribe(self, self.show_state)
        self.show_state(self.forge.state)

    def show_state(self, state: SearchState) -> None:
        self.query_one(SpeedupPlot).show(state)
        self.query_one(CostPlot).show(state)
