"""Cost against speedup: every passed node, what its proposer spent (an LLM's money; the templates
cost nothing) against the speedup it reached."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from ...state import SearchState, points


class CostPlot(PlotextPlot):
    DEFAULT_CSS = """
    CostPlot { height: 1fr; }
    """

    def show(self, state: SearchState) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("cost ($) against speedup")
        plt.xlabel("cost per node ($)")
        by_card: dict[str, tuple[list[float], list[float]]] = {}
        for card, cost, sp in points(state):
            xs, ys = by_card.setdefault(card, ([], []))
            xs.append(cost)
            ys.append(sp)
        if not by_card:
            plt.scatter([0.0], [1.0], label="no passed node yet")
        for card, (xs, ys) in by_card.items():
            plt.scatter(xs, ys, label=card[:20])
        self.refresh()
