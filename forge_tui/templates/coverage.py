"""Which proposer covers a card: a template family, the code generator after them, or the LLM agent
alone, and why not the offline ones. Worked out once where cards are made (the profiler, a card
added from a function or a description) and stored on the card (``Card.coverage``), so that the op
table, the card pane and the share of the forward served offline only read it. Nothing here
imports the search: the profiler builds on it."""

from __future__ import annotations

import itertools

from ..cards import Card, Coverage
from ..codegen import Generated, kernel_or_reason
from ..kernels.device import DeviceProps, detect_device
from ..kernels.family import Family, Match
from .registry import match, range_refusals


def valid_points(fam: Family, m: Match, backend: str, device: DeviceProps, limit: int | None = None) -> list[dict]:
    """The family's valid configurations for the matched card on this backend (the first
    ``limit`` of them), in the axes' product order."""
    axes = fam.axes(m, backend, device)
    keys = sorted(axes)
    out = []
    for values in itertools.product(*(axes[k] for k in keys)):
        p = dict(zip(keys, values))
        if fam.valid(m, p, backend, device):
            out.append(p)
            if limit and len(out) >= limit:
                break
    return out


def has_point(fam: Family, m: Match, backend: str, device: DeviceProps) -> bool:
    """Whether the family has a valid configuration for the matched card on this backend."""
    return bool(valid_points(fam, m, backend, device, limit=1))


def why_none(card: Card, fam: Family | None, m: Match | None, backend: str, device: DeviceProps) -> str | None:
    """Why no offline proposer has a kernel for the card (``fam``, ``m``: ``registry.match``'s),
    in one line; None where one has."""
    if fam is None or m is None:
        why = kernel_or_reason(card)
        refusals = range_refusals(card) if card.ranges else []
        if refusals:  # a family computes the card at one size, none over its range
            return (f"no kernel serves {card.target} over its range: " + "; ".join(refusals) +
                    (f"; nor does the generator: {why}" if isinstance(why, str) else "") + " (left to the LLM agent)")
        return (f"no template family serves {card.target}, nor the generator: {why} (left to the LLM agent)"
                if isinstance(why, str) else f"no template family serves {card.target} (left to the LLM agent)")
    if not has_point(fam, m, backend, device):
        return f"the {fam.name} templates have no valid configuration for this shape"
    return None


def backend_of(card: Card) -> str:
    """The backend a card's kernels are built for: the device it was profiled on."""
    return "cuda" if card.device == "cuda" else "cpu"


def coverage_of(card: Card, device: DeviceProps | None = None) -> Coverage:
    """Which proposer covers the card on the backend it was profiled on (``device``: the GPU the
    families size their kernels for, by default the one present). A check that fails says so as
    its reason: the card is then left to the agent, and the table shows it unserved."""
    try:
        fam, m = match(card)
        why = why_none(card, fam, m, backend_of(card), device or detect_device())
        if why is None and fam is not None and m is not None:
            return Coverage(proposer="generator" if isinstance(fam, Generated) else "template", family=m.family)
    except Exception as exc:  # noqa: BLE001 - a card whose check fails is still made, with the reason
        why = f"the check failed ({type(exc).__name__}: {exc})"
    return Coverage(proposer="agent", why_not=why)


def cover(cards: list[Card], device: DeviceProps | None = None, again: bool = False) -> list[Card]:
    """Store on each card (in place) which proposer covers it: on the cards without the fact, or on
    every card with ``again`` (a card whose fact came from elsewhere). Returns ``cards``."""
    todo = [c for c in cards if again or c.coverage is None]
    if todo:
        dev = device or detect_device()
        for card in todo:
            card.coverage = coverage_of(card, dev)
    return cards
