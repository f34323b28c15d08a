"""The fallback pane: per promoted card, kernel active or disabled and why, calls served and fallen
back with their reasons (the runtime's ``status.json``, re-read while a model runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

if TYPE_CHECKING:
    from ....runtime.manifest import Entry


def rows(status: dict[str, Any] | None, promoted: "list[Entry]") -> list[tuple[str, str, str, str, str, str]]:
    """(card, kernel, served, fell back, dispatch, why) per card promoted or seen by the runtime:
    the table's cells short enough for 80 columns (kernel "active 1.87x", "off", "DISABLED";
    fell back a count), ``why`` the whole story for the line under the table."""
    live = {c["card"]: c for c in (status or {}).get("cards", [])}
    out = []
    for card in list(dict.fromkeys([e.card for e in promoted] + list(live))):
        entry = next((e for e in promoted if e.card == card), None)
        c = live.get(card)
        sp = entry.evidence.speedup_vs_eager if entry is not None else None
        if entry is not None and not entry.enabled:
            state, why = "off", f"switched off: {entry.disabled_reason}"
        elif c is not None and not c.get("active", True):
            state, why = "DISABLED", f"disabled: {c.get('disabled_reason', '')}"
        else:
            state, why = "active" + (f" {sp:.2f}x" if sp else ""), "active" + (f", {sp:.3f}x eager alone" if sp else "")
        served = str(c.get("served", 0)) if c else "-"
        fb = c.get("fallbacks", {}) if c else {}
        fell = ", ".join(f"{n} {why}" for why, n in sorted(fb.items(), key=lambda x: -x[1])) or ("none" if c else "-")
        traced = c.get("traced_fallbacks", {}) if c else {}
        if traced:  # compiled graphs decide at their trace: graphs, not calls
            fell += "; compiled graphs: " + ", ".join(f"{n} ({why})" for why, n in sorted(traced.items(), key=lambda x: -x[1]))
        count = str(sum(fb.values())) if c else "-"
        disp = f"{c['dispatch_us']:.1f} µs" if c and c.get("dispatch_us") else "-"
        out.append((card, state, served, count, disp, f"{card}: {why}; served {served}; fell back: {fell}"))
    return out


class RuntimeStatus(Vertical):
    DEFAULT_CSS = """
    RuntimeStatus { height: 1fr; }
    RuntimeStatus > #runtime-head { height: auto; padding: 0 1; color: $text-muted; }
    RuntimeStatus > DataTable { height: 1fr; }
    RuntimeStatus > #runtime-why { height: auto; max-height: 5; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("reading the runtime's status ...", id="runtime-head")
        yield DataTable(id="runtime-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="runtime-why")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("card", "kernel", "served", "fell back", "dispatch")
        self._last: tuple[object, ...] = ()
        self._rows: list[tuple[str, str, str, str, str, str]] = []

    def show(self, status: dict[str, Any] | None, promoted: "list[Entry]") -> None:
        data = rows(status, promoted)
        key = (tuple(data), (status or {}).get("pid"))
        if key == self._last:
            return
        self._last = key
        head = self.query_one("#runtime-head", Static)
        if status is None:
            head.update(f"{len(promoted)} promoted kernel(s); no model has run with them yet "
                        "(b runs the model here; an applied model writes .forge/runtime/status.json)")
        else:
            head.update(f"{len(promoted)} promoted kernel(s); live status of process {status.get('pid')}, "
                        f"updated {status.get('updated_at', '?')}")
        table = self.query_one(DataTable)
        self._rows = data
        row_at = table.cursor_row
        table.clear()
        for row in data:
            table.add_row(*row[:5], key=row[0])
        if data:
            table.move_cursor(row=min(max(row_at, 0), len(data) - 1))
        self._why(table.cursor_row)

    def _why(self, row: int) -> None:
        """The highlighted card in full (the table's cells are cut at narrow widths)."""
        why = self.query_one("#runtime-why", Static)
        why.update(self._rows[row][5] if 0 <= row < len(self._rows) else "")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._why(event.cursor_row)
