"""Best speedup over evaluations, one line per card (a step up each time its best improves)."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from ...state import SearchState


def series(state: SearchState) -> dict[str, tuple[list[int], list[float]]]:
    """Per card, its best speedup over evaluations as a step line from (0, 1.0), each line drawn
    to the last evaluation of every run (retimes included), not only to the card's own last."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for n, card, best in state.progress:
        xs, ys = out.setdefault(card, ([0], [1.0]))
        xs += [n, n]  # a step: the best holds until it improves
        ys += [ys[-1], best]
    last = max([state.evaluations, *(n for n, _, _ in state.progress)], default=0)
    for xs, ys in out.values():
        if xs[-1] < last:
            xs.append(last)
            ys.append(ys[-1])
    return out


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
        lines = series(state)
        if not lines:
            plt.plot([0, 1], [1.0, 1.0], label="no evaluation yet")
        for card, (xs, ys) in lines.items():
            plt.plot(xs, ys, label=card[:20], marker="braille")
        last = max((xs[-1] for xs, _ in lines.values()), default=0)
        if last:
            plt.xlim(0, last)
        self.refresh()
