"""The op table: cards by share of the forward, each op card nested in a module card shown under
it, the offline kernel (template family or generator) that serves each card, and the share of the
forward those kernels serve. It only renders what the cards carry: which proposer covers a card is
worked out where the card is made and stored on it (``Card.coverage``)."""

from __future__ import annotations

import io

from .cards import DTYPE_SHORT, Card, CardKind, not_served
from .profiler.trust import distrust, ranked, shares_note

COLUMNS = ("#", "card", "kind", "target", "shapes", "dtype", "calls", "µs/call", "share", "floor µs", "headroom", "kernel")
NESTED = "└ "


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def display_name(card: Card) -> str:
    """A card as a person names it: the module or op, its first input's shape (an op's operands'
    where they are short) and its dtype ("RMSNorm 2x16x64 fp32", "mm 32x64·64x128 fp32"); a chain
    of more than three ops by its first two and its last ("mul+slice+…+add 2x4x16x8 fp32")."""
    name = card.op_name
    if card.kind == CardKind.CHAIN:
        ops = name.split("+")
        if len(ops) > 3:
            name = "+".join(ops[:2]) + "+…+" + ops[-1]
    def dims(spec) -> str:
        return "x".join(str(d) for d in spec.shape) or "scalar"

    first = next((s for s in card.inputs if s.role == "input"), None) or next(iter(card.inputs), None)
    shape = dims(first) if first is not None else ""
    if card.kind == CardKind.OP:  # an op's operands tell its cards apart (mm 32x64·64x128, mm 32x64·64x64)
        both = "·".join(dims(s) for s in card.inputs if s.role in ("input", "param"))
        if len(both) <= 24:
            shape = both
    return " ".join(p for p in (name, shape, DTYPE_SHORT.get(card.dtype, card.dtype)) if p)


def share_text(card: Card) -> str:
    """The card's share of the forward (of a generation: with its prefill's and its decode steps'
    shares apart, ``12.0% (2.0/10.0)``), ``?`` marking a time that is not trusted."""
    if card.share is None:
        return "-"
    return f"{100 * card.share:.1f}%" + ("?" if distrust(card) else "") + phase_text(card.phase_share)


def phase_text(phase_share: dict[str, float] | None) -> str:
    """`` (prefill/decode)`` shares in percent, empty outside a generation's profile."""
    if not phase_share:
        return ""
    return f" ({100 * phase_share.get('prefill', 0.0):.1f}/{100 * phase_share.get('decode', 0.0):.1f})"


def time_text(card: Card) -> str:
    """The card's time a call, ``?`` marking a time that is not trusted."""
    return _fmt(card.time_us, ".1f") + ("?" if card.time_us is not None and distrust(card) else "")


def headroom_text(card: Card) -> str:
    """How far above its floor eager runs, ``?`` where the time it divides is not trusted."""
    return _fmt(card.headroom, ".1f") + ("" if card.headroom is None else "x" + ("?" if distrust(card) else ""))


def ordered(cards: list[Card]) -> list[tuple[Card, bool]]:
    """The cards in their order, each op card nested in a module or chain card of the list moved
    right under the first such card; (card, nested)."""
    present = {c.id for c in cards}
    children: dict[str, list[Card]] = {}
    for c in cards:
        parent = next((p for p in c.within if p in present), None) if c.kind == CardKind.OP else None
        if parent is not None:
            children.setdefault(parent, []).append(c)
    nested = {c.id for kids in children.values() for c in kids}
    out: list[tuple[Card, bool]] = []
    for c in cards:
        if c.id in nested:
            continue
        out.append((c, False))
        out.extend((k, True) for k in children.get(c.id, []))
    return out


def offline_share(cards: list[Card], served: dict[str, str]) -> dict[str, float]:
    """The share of the forward served by offline kernels: module and chain cards with one, plus
    op cards with one that are not nested in a served module or chain card (nested ones are
    counted through it)."""
    by_id = {c.id: c for c in cards}
    module = sum(c.share or 0.0 for c in cards if c.kind == CardKind.MODULE and c.id in served)
    chain = sum(c.share or 0.0 for c in cards if c.kind == CardKind.CHAIN and c.id in served)
    op = 0.0
    for c in cards:
        if c.kind != CardKind.OP or c.id not in served:
            continue
        parents = [by_id[p] for p in c.within if p in by_id]
        if parents and all(p.id in served for p in parents):
            continue
        op += c.share or 0.0
    return {"total": module + chain + op, "module": module, "chain": chain, "op": op}


def served_by(cards: list[Card]) -> dict[str, str]:
    """card id -> the family whose offline kernels serve it (``generated`` for the generator), as
    the card's coverage says, for the cards the runtime serves (``cards.not_served``). A card
    without coverage (made outside a workspace or a profile) is shown unserved."""
    return {c.id: c.coverage.family for c in cards
            if c.coverage is not None and c.coverage.family is not None and c.coverage.proposer != "agent"
            and not_served(c.kind, c.flags) is None}


def rows(cards: list[Card], served: dict[str, str] | None = None) -> list[dict]:
    served = served or {}
    out = []
    for i, (c, nested) in enumerate(ordered(cards), 1):
        out.append({
            "#": i, "card": c.id, "kind": c.kind, "target": c.op_name, "shapes": c.shapes(),
            "name": display_name(c), "dtype": DTYPE_SHORT.get(c.dtype, c.dtype), "calls": c.calls,
            "time_us": c.time_us, "share": c.share, "floor_us": c.floor_us, "headroom": c.headroom,
            "flags": c.flags, "within": c.within, "nested": nested, "kernel": served.get(c.id),
            "trusted": distrust(c) is None,
            **({"phase_share": c.phase_share} if c.phase_share else {}),
            **({"ranges": {k: [r.min, r.max] for k, r in c.ranges.items()}} if c.ranges else {}),
        })
    return out


def cells(row: dict) -> list[str]:
    return [
        str(row["#"]), (NESTED if row.get("nested") else "") + row["card"], row["kind"], row["target"], row["shapes"],
        row["dtype"], str(row["calls"]),
        _fmt(row["time_us"], ".1f") + ("" if row.get("trusted", True) or row["time_us"] is None else "?"),
        "-" if row["share"] is None else f"{100 * row['share']:.1f}%" + ("" if row.get("trusted", True) else "?")
        + phase_text(row.get("phase_share")),
        _fmt(row["floor_us"], ".2f"),
        "-" if row["headroom"] is None else f"{row['headroom']:.1f}x" + ("" if row.get("trusted", True) else "?"),
        row.get("kernel") or "-",
    ]


def render(cards: list[Card], title: str = "", width: int = 200, limit: int | None = None,
           served: dict[str, str] | None = None) -> str:
    """Plain-text table (rich does the layout), the cards ranked by their share of the forward, a
    card whose time is not trusted by its bytes and FLOPs (``profiler.trust``). ``served``: card id
    -> the offline kernel's family (by default the cards' own coverage, ``served_by``)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if served is None:
        served = served_by(cards)
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in ("#", "calls", "µs/call", "share", "floor µs", "headroom") else "left",
                         overflow="fold", max_width=60 if col == "shapes" else None)
    cards = ranked(cards)
    all_rows = rows(cards, served)
    shown = all_rows if limit is None else all_rows[:limit]
    for row in shown:
        table.add_row(*cells(row))
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(table)
    text = "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"
    if limit is not None and len(cards) > limit:
        text += f"... {len(cards) - limit} more cards\n"
    if any(r["nested"] for r in shown):
        text += f"{NESTED}an op card nested in the module or chain card above it (every call made inside it)\n"
    if served and any(c.share is not None for c in cards):
        s = offline_share(cards, served)
        text += (f"offline kernels (templates, generator) serve {100 * s['total']:.1f}% of the forward: "
                 f"module cards {100 * s['module']:.1f}%, " +
                 (f"chain cards {100 * s['chain']:.1f}%, " if s["chain"] else "") +
                 f"op cards outside them {100 * s['op']:.1f}%\n")
    if any(r.get("phase_share") for r in shown):
        text += ("share (prefill/decode): of the whole generation, the prefill's calls and the decode steps' apart; "
                 "a range card (shapes with lo..hi) is one card over every size its calls had\n")
    note = shares_note(cards, {r["card"] for r in all_rows if r["nested"]})
    if note:
        text += note + "\n"
    if not all(r["trusted"] for r in shown):
        text += ("? timed while the machine was busy: not trusted, ranked by bytes and FLOPs until timed again "
                 "(forge-tui times it again once the machine is quiet)\n")
    return text
