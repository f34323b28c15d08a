"""The test results pane: the evaluation's verdict, correctness per input set, timing with spread."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ...backend import NodeDetail


def verdict(detail: NodeDetail) -> str:
    r = detail.result
    if r is None:
        return detail.missing or ("the eager reference (the fallback)" if detail.node == "root" else
                                  "no evaluation recorded")
    lines = [f"{r.status.upper()}" + (f": {r.reason}" if r.reason else "")]
    t = r.timing
    if t:
        sp = t.speedup_vs_eager
        lines.append(f"{sp.median:.3f}x eager [{sp.q1:.3f}, {sp.q3:.3f}]  candidate {t.candidate.median:.2f} µs, "
                     f"eager {t.eager.median:.2f} µs" + ("" if t.quiet else "  (machine busy: not trusted)"))
    if r.traceback:
        lines.append(r.traceback.strip().splitlines()[-1][:300])
    return "\n".join(lines)


class TestResults(Vertical):
    DEFAULT_CSS = """
    TestResults { height: 1fr; }
    TestResults > #tests-verdict { height: auto; max-height: 6; padding: 0 1; }
    TestResults > DataTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("no node selected", id="tests-verdict")
        yield DataTable(id="tests-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("input set", "result", "determinism", "note")

    def show(self, detail: NodeDetail) -> None:
        self.query_one("#tests-verdict", Static).update(verdict(detail))
        table = self.query_one(DataTable)
        table.clear()
        r = detail.result
        if r is None or r.correctness is None:
            return
        for s in r.correctness.sets:
            table.add_row(s.name, "ok" if s.ok else "FAILED", s.determinism, "degenerate" if s.degenerate else "")
