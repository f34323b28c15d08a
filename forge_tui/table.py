"""The op table: cards by share of the forward."""

from __future__ import annotations

import io

from .cards import DTYPE_SHORT, Card

COLUMNS = ("#", "card", "kind", "target", "shapes", "dtype", "calls", "µs/call", "share", "floor µs", "headroom")


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def rows(cards: list[Card]) -> list[dict]:
    out = []
    for i, c in enumerate(cards, 1):
        out.append({
            "#": i, "card": c.id, "kind": c.kind, "target": c.op_name, "shapes": c.shapes(),
            "dtype": DTYPE_SHORT.get(c.dtype, c.dtype), "calls": c.calls,
            "time_us": c.time_us, "share": c.share, "floor_us": c.floor_us, "headroom": c.headroom,
            "flags": c.flags,
        })
    return out


def cells(row: dict) -> list[str]:
    return [
        str(row["#"]), row["card"], row["kind"], row["target"], row["shapes"], row["dtype"], str(row["calls"]),
        _fmt(row["time_us"], ".1f") + ("?" if "noisy_timing" in row["flags"] else ""), "-" if row["share"] is None else f"{100 * row['share']:.1f}%",
        _fmt(row["floor_us"], ".2f"), "-" if row["headroom"] is None else f"{row['headroom']:.1f}x",
    ]


def render(cards: list[Card], title: str = "", width: int = 200, limit: int | None = None) -> str:
    """Plain-text table (rich does the layout)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in ("#", "calls", "µs/call", "share", "floor µs", "headroom") else "left",
                         overflow="fold", max_width=60 if col == "shapes" else None)
    shown = cards if limit is None else cards[:limit]
    for row in rows(shown):
        table.add_row(*cells(row))
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(table)
    text = "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"
    if limit is not None and len(cards) > limit:
        text += f"... {len(cards) - limit} more cards\n"
    if any("noisy_timing" in c.flags for c in shown):
        text += "? timed while the machine was busy: not trustworthy (profile again on a quiet machine)\n"
    return text
