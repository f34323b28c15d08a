"""The evidence of one promotion request: speedup with its spread against eager and torch.compile,
the correctness runs, the profile, the diff against its parent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

if TYPE_CHECKING:
    from ....promotion import Request


def spread_bar(q1: float, median: float, q3: float, width: int = 20, top: float | None = None) -> Text:
    """The speedup's interquartile range and median on a scale from 0 to ``top``; 1.0 (eager) marked."""
    top = top or max(2.0, q3 * 1.1)
    cells = [" "] * width

    def at(x: float) -> int:
        return max(0, min(width - 1, int(round(x / top * (width - 1)))))

    for i in range(at(q1), at(q3) + 1):
        cells[i] = "─"
    cells[at(1.0)] = "│"
    cells[at(median)] = "●"
    return Text.assemble("0 ", ("".join(cells), "green" if q1 > 1.0 else "yellow"), f" {top:.1f}x")


def evidence(req: "Request") -> RenderableType:
    ev = req.evidence
    parts: list[RenderableType] = []
    sp = ev.speedup_vs_eager or 0.0
    head = Text.assemble((f"{req.card.id} {req.node}", "bold"), f"  {sp:.3f}x eager")
    if ev.speedup_vs_eager_q1 is not None and ev.speedup_vs_eager_q3 is not None:
        head.append(f" [{ev.speedup_vs_eager_q1:.3f}, {ev.speedup_vs_eager_q3:.3f}]")
    head.append(f", {ev.speedup_vs_compile:.2f}x torch.compile" if ev.speedup_vs_compile else ", torch.compile not timed")
    parts.append(head)
    if ev.speedup_vs_eager_q1 is not None and ev.speedup_vs_eager_q3 is not None:
        parts.append(spread_bar(ev.speedup_vs_eager_q1, sp, ev.speedup_vs_eager_q3))
    times = [f"kernel {ev.time_us:.2f} µs" if ev.time_us else "", f"eager {ev.eager_us:.2f} µs" if ev.eager_us else "",
             f"torch.compile {ev.compile_us:.2f} µs" if ev.compile_us else "",
             f"its kernels {ev.compile_device_us:.2f} µs of device time" if ev.compile_device_us else "",
             f"{100 * ev.fraction_of_floor:.0f}% of the roofline floor" if ev.fraction_of_floor else ""]
    parts.append(Text("  ".join(t for t in times if t)))
    parts.append(Text(f"correct on {len(ev.input_sets)} input sets: {', '.join(ev.input_sets)}"))
    prof = ev.profile
    parts.append(Text("profile: " + (", ".join(f"{k} {v}" for k, v in prof.items() if v is not None and k != "available")
                                     if prof else "none (no Nsight Compute here)"), style="dim"))
    parts.append(Text(f"{req.backend} backend; y approves (builds it for this machine), n rejects", style="dim"))
    if ev.diff.strip():
        parts.append(Syntax(ev.diff, "diff", theme="ansi_dark", background_color="default"))
    else:
        parts.append(Text("no diff (its parent is the eager reference)", style="dim"))
    return Group(*parts)


class EvidenceView(VerticalScroll):
    DEFAULT_CSS = """
    EvidenceView { height: 1fr; padding: 0 1; }
    """

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static("", id="evidence-text")

    def show(self, req: "Request | None", note: str = "") -> None:
        text = self.query_one("#evidence-text", Static)
        if req is None:
            text.update(note or "no promotion request waiting: a request is a card's best node faster than eager")
        else:
            text.update(evidence(req))
        self.scroll_home(animate=False)
