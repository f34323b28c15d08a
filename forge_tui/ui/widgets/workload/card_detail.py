"""The card pane: everything a card knows, for the highlighted row; its time, share and roofline
first (a short pane shows them without scrolling), the rest below, scrollable."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ....cards import Card
from ....profiler.trust import distrust, rank_shares
from ....table import display_name
from ...offline import offline_line

__all__ = ["CardDetail", "describe", "offline_line"]


def describe(card: Card, rank_share: float | None = None, offline: str | None = None) -> str:
    """The pane's text (Rich markup: the name in bold, the rest escaped). ``rank_share``: the
    share the op table ranks an untrusted card by (``profiler.trust.rank_shares``); ``offline``:
    its ``offline_line`` (worked out in a worker: it imports the templates, and torch)."""
    lines = [f"id {card.id}   {card.kind}   {card.target}"]
    t = "-" if card.time_us is None else f"{card.time_us:.2f} µs/call ±{100 * (card.time_spread or 0):.1f}%"
    share = "-" if card.share is None else f"{100 * card.share:.1f}%"
    lines.append(f"{t}, {card.calls} calls, {share}")
    if card.floor_us is not None:
        head = "-" if card.headroom is None else f"{card.headroom:.1f}x"
        lines.append(f"floor {card.floor_us:.2f} µs, headroom {head}")
    why = distrust(card)
    if why is not None:
        est = f" (as {100 * rank_share:.2f}% of the forward)" if rank_share is not None else ""
        lines.append(f"? not trusted: {why}; ranked by its bytes and FLOPs{est} until it is timed again on a "
                     "quiet machine")
    lines.append(f"bytes {card.bytes:,}   flops {card.flops:,}")
    lines.append(offline or "offline kernel: (looking it up ...)")
    if card.module_paths:
        more = f" (+{len(card.module_paths) - 3} more)" if len(card.module_paths) > 3 else ""
        lines.append("modules: " + ", ".join(card.module_paths[:3]) + more)
    lines.append("")
    for s in card.inputs:
        extra = f" {s.name}" if s.name else ""
        lines.append(f"  in  {s.role:6s}{extra} {s.short()} stride {tuple(s.stride)}")
    for s in card.outputs:
        lines.append(f"  out        {s.short()} stride {tuple(s.stride)}")
    lines.append(f"samples {len(card.samples)}" + (f"   flags {', '.join(card.flags)}" if card.flags else ""))
    ops = [n["op"] for n in card.program.get("nodes", [])]
    if len(ops) > 1:
        lines.append("program: " + " -> ".join(o.removeprefix("aten.").removesuffix(".default") for o in ops))
    return f"[b]{escape(display_name(card))}[/b]\n" + escape("\n".join(lines))


class CardDetail(VerticalScroll):
    DEFAULT_CSS = """
    CardDetail { height: 1fr; padding: 0 1; }
    CardDetail > Static { width: 1fr; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.card: Card | None = None
        self._ranks: dict[str, float] = {}
        self._offline: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static("", id="card-text")

    def set_cards(self, cards: list[Card], offline: dict[str, str] | None = None) -> None:
        """The workspace's cards (what an untrusted card is ranked by depends on the others), and
        each one's ``offline_line``."""
        self._ranks = rank_shares(cards)
        self._offline = dict(offline or {})
        if self.card is not None:
            self.show(self.card)

    def show(self, card: Card | None) -> None:
        self.card = card
        text = self.query_one("#card-text", Static)
        text.update("" if card is None else describe(card, self._ranks.get(card.id), self._offline.get(card.id)))
        self.scroll_home(animate=False)
