"""The card pane: everything a card knows, for the highlighted row."""

from __future__ import annotations

from rich.markup import escape
from textual.widgets import Static

from ....cards import Card


def describe(card: Card) -> str:
    lines = [f"[b]{escape(card.label)}[/b]", f"id {card.id}   kind {card.kind}   target {card.target}"]
    if card.module_paths:
        more = f" (+{len(card.module_paths) - 3} more)" if len(card.module_paths) > 3 else ""
        lines.append("modules: " + ", ".join(card.module_paths[:3]) + more)
    lines.append("")
    for s in card.inputs:
        extra = f" {s.name}" if s.name else ""
        lines.append(f"  in  {s.role:6s}{extra} {s.short()} stride {tuple(s.stride)}")
    for s in card.outputs:
        lines.append(f"  out        {s.short()} stride {tuple(s.stride)}")
    lines.append("")
    t = "-" if card.time_us is None else f"{card.time_us:.2f} µs/call (spread {100 * (card.time_spread or 0):.1f}%)"
    lines.append(f"time {t}   calls {card.calls}   share {100 * (card.share or 0):.1f}%")
    lines.append(f"bytes {card.bytes:,}   flops {card.flops:,}")
    if card.floor_us is not None:
        head = "-" if card.headroom is None else f"{card.headroom:.1f}x"
        lines.append(f"roofline floor {card.floor_us:.2f} µs   headroom {head}")
    lines.append(f"samples {len(card.samples)}" + (f"   flags {', '.join(card.flags)}" if card.flags else ""))
    ops = [n["op"] for n in card.program.get("nodes", [])]
    if len(ops) > 1:
        lines.append("")
        lines.append("program: " + " -> ".join(o.removeprefix("aten.").removesuffix(".default") for o in ops))
    return lines[0] + "\n" + escape("\n".join(lines[1:]))


class CardDetail(Static):
    DEFAULT_CSS = """
    CardDetail { height: 1fr; padding: 0 1; overflow-y: auto; }
    """

    def show(self, card: Card | None) -> None:
        self.update("" if card is None else describe(card))
