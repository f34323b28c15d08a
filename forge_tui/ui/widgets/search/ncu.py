"""The ncu report pane: Nsight Compute's parsed metrics for the node's launch (and Nsight Systems'
kernel launches where nsys is installed), and where it stands against the card's roofline floor, as a
bar (from the profile where there is one, else from timing)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static

from ...backend import NodeDetail


def metrics(detail: NodeDetail) -> tuple[list[str], float | None]:
    """Lines to show and the fraction of the roofline floor reached (None when unknown)."""
    r = detail.result
    if r is None:
        return [detail.missing or "no evaluation recorded for this node"], None
    lines: list[str] = []
    p = r.profile
    fraction = None
    if p is not None and p.available:
        for name, value, unit in (("duration", p.duration_us, " µs"), ("DRAM throughput", p.dram_throughput_pct, "%"),
                                  ("SM throughput", p.sm_throughput_pct, "%"),
                                  ("achieved occupancy", p.achieved_occupancy_pct, "%"),
                                  ("registers/thread", p.registers_per_thread, ""), ("roofline floor", p.floor_us, " µs")):
            if value is not None:
                lines.append(f"{name:20s} {value:10.2f}{unit}")
        fraction = p.fraction_of_floor
    else:
        lines.append("Nsight Compute: " + (p.reason if p is not None and p.reason else
                                           "no profile for this node (the CPU backend, or ncu not run)"))
    tl = p.timeline if p is not None else None
    if tl and tl.get("available"):
        lines.append(f"nsys: {tl.get('launches_per_call', 0):g} kernel launches a call")
        for k in tl.get("kernels", [])[:4]:
            lines.append(f"  {k.get('kernel', '?')[:40]:40s} x{k.get('launches_per_call', 0):g}  "
                         f"{k.get('avg_us') or 0:.2f} µs avg")
    t = r.timing
    if t is not None and t.floor_us:
        lines.append(f"{'timed':20s} {t.candidate.median:10.2f} µs   floor {t.floor_us:.2f} µs")
        if fraction is None:
            fraction = t.fraction_of_floor
    if r.build is not None and r.build.resources:
        for kernel, res in list(r.build.resources.items())[:4]:
            regs = res.get("registers")
            spill = res.get("spill_store_bytes", 0) + res.get("spill_load_bytes", 0)
            lines.append(f"{kernel[:30]:30s} {regs} regs, {res.get('shared_bytes', 0)} B smem, {spill} B spilled")
    return lines, fraction


class NcuReport(Vertical):
    DEFAULT_CSS = """
    NcuReport { height: 1fr; padding: 0 1; }
    NcuReport > #ncu-bar-row { height: 1; }
    NcuReport > #ncu-bar-row > Label { width: auto; }
    NcuReport > #ncu-text { height: auto; }
    """

    def compose(self) -> ComposeResult:
        from textual.containers import Horizontal

        with Horizontal(id="ncu-bar-row"):
            yield Label("roofline ", id="ncu-bar-label")
            yield ProgressBar(total=100, show_eta=False, id="ncu-bar")
        yield Static("no node selected", id="ncu-text")

    def show(self, detail: NodeDetail) -> None:
        lines, fraction = metrics(detail)
        bar = self.query_one("#ncu-bar", ProgressBar)
        label = self.query_one("#ncu-bar-label", Label)
        if fraction is None:
            bar.update(total=100, progress=0)
            label.update("roofline (unknown) ")
        else:
            bar.update(total=100, progress=max(0.0, min(100.0, 100 * fraction)))
            label.update("roofline ")
        self.query_one("#ncu-text", Static).update("\n".join(lines))
