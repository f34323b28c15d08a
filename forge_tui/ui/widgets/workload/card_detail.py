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
    lines.append(offline_line(card))
    ops = [n["op"] for n in card.program.get("nodes", [])]
    if len(ops) > 1:
        lines.append("")
        lines.append("program: " + " -> ".join(o.removeprefix("aten.").removesuffix(".default") for o in ops))
    return lines[0] + "\n" + escape("\n".join(lines[1:]))


def offline_line(card: Card) -> str:
    """Which offline proposer serves the card (a template family, or the code generator), or the
    one line that says why none does: the op or the access pattern."""
    from ....templates.proposer import TemplateProposer
    from ....templates.registry import match

    try:
        why = TemplateProposer().supports(card, "cuda" if card.device == "cuda" else "cpu")
        if why is None:
            _, m = match(card)
            return f"offline kernel: {m.family if m is not None else '?'}"
    except Exception as exc:  # noqa: BLE001 - the pane shows the rest of the card regardless
        why = f"the check failed ({type(exc).__name__}: {exc})"
    return f"offline kernel: none ({why})"


class CardDetail(Static):
    DEFAULT_CSS = """
    CardDetail { height: 1fr; padding: 0 1; overflow-y: auto; }
    """

    def show(self, card: Card | None) -> None:
        self.update("" if card is None else describe(card))
