"""Best speedup over evaluations, one line per card (a step up each time its best improves)."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from ...state import SearchState


class SpeedupPlot(PlotextPlot):
    DEFAULT_CSS = """
    SpeedupPlot { height: 1fr; }
    """

    def show(self, state: SearchState) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("best speedup over evaluations")
        plt.xlabel("evaluations")
        series: dict[str, tuple[list[int], list[float]]] = {}
        for n, card, best in state.progress:
            xs, ys = series.setdefault(card, ([0], [1.0]))
            xs += [n, n]  # a step: the best holds until it improves
            ys += [ys[-1], best]
        if not series:
            plt.plot([0, 1], [1.0, 1.0], label="no evaluation yet")
        for card, (xs, ys) in series.items():
            plt.plot(xs, ys, label=card[:20], marker="braille")
        self.refresh()
