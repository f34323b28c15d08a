"""Whether a card's profiled time can be trusted, and what the op table ranks it by until it can.

A card timed while the machine was busy (``noisy_timing``), or timed at more of the forward than
the whole forward (``share_over_forward``), carries a time that can be orders of magnitude off: a
16x16 ``triu`` measured at 20 ms a call on a two-core machine running two busy processes, 11.6% of
the forward. Such a card is timed again once the machine is quiet (``profiler.retime``); until
then it is ranked by what it must move and compute (its bytes and FLOPs, through its roofline
floor), never by that time.

Plain Python over cards: no torch, no Textual.
"""

from __future__ import annotations

import statistics

from ..cards import Card

UNTRUSTED_FLAGS = {
    "noisy_timing": "timed while the machine was busy",
    "share_over_forward": "timed at more than the whole forward",
}
"""Flags that make a card's time untrustworthy, and what each means."""


def distrust(card: Card) -> str | None:
    """Why the card's profiled time is not trusted, or None where it is."""
    for flag, why in UNTRUSTED_FLAGS.items():
        if flag in card.flags:
            return why
    return None


def _forward_us(cards: list[Card]) -> float | None:
    """The forward's time the shares were computed against (every card's share divides its total
    time by the same forward time)."""
    ratios = [c.total_us / c.share for c in cards if c.share and c.time_us]
    return statistics.median(ratios) if ratios else None


OP_US = 5.0
"""What one eager op costs above its roofline floor (dispatch, a launch) until a trusted card says
what it costs on this machine: a prior, only ever used to rank untrusted cards among themselves."""


def ops_in(card: Card) -> int:
    """How many eager ops one call of the card makes (its program's nodes; at least one)."""
    return max(1, len(card.program.get("nodes", []) if isinstance(card.program, dict) else []))


def rank_shares(cards: list[Card]) -> dict[str, float]:
    """The share of the forward each card is ranked by: its measured share where its time is
    trusted; for an untrusted card an estimate from what it must move and compute: its roofline
    floor (its bytes and FLOPs) plus, for each eager op it makes, what an op costs above its floor
    on this machine (the median over the trusted cards, ``OP_US`` where none is trusted). A card
    without a time ranks at 0."""
    trusted = [c for c in cards if distrust(c) is None and c.time_us and c.floor_us is not None]
    per_op = statistics.median([max(0.0, (c.time_us or 0.0) - (c.floor_us or 0.0)) / ops_in(c) for c in trusted]) \
        if trusted else OP_US
    forward = _forward_us(cards)
    out: dict[str, float] = {}
    for c in cards:
        if distrust(c) is None:
            out[c.id] = c.share or 0.0
        elif c.floor_us is not None and forward:
            out[c.id] = (c.floor_us + ops_in(c) * per_op) * c.calls / forward
        else:
            out[c.id] = 0.0
    return out


def ranked(cards: list[Card]) -> list[Card]:
    """The cards by the share they rank by (``rank_shares``), largest first (ties by id)."""
    shares = rank_shares(cards)
    return sorted(cards, key=lambda c: (-shares[c.id], c.id))


def shares_note(cards: list[Card], nested: set[str] | None = None) -> str | None:
    """One line saying why the shares of the forward shown add up to more than all of it, or None
    where they do not. ``nested``: op cards counted through the module or chain card they run
    inside (``table.ordered``), left out of the sum."""
    nested = nested or set()
    top = [c for c in cards if c.id not in nested and c.share]
    total = sum(c.share or 0.0 for c in top)
    if total <= 1.0:
        return None
    loud = [c for c in top if distrust(c) is not None]
    if loud:
        return (f"shares add up to {100 * total:.1f}% of the forward: {len(loud)} card(s) marked ? were timed on a "
                "busy machine, far longer than they take; they rank by bytes and FLOPs until timed again on a quiet one")
    return (f"shares add up to {100 * total:.1f}% of the forward: each card is timed alone on its own inputs, "
            "and some take longer alone than inside the forward")
