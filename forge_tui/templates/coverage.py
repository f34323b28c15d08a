"""Which cards an offline proposer (a template family, or the generator after them) has a kernel
for: what the op table reports as the share of the forward served without an LLM."""

from __future__ import annotations

from ..cards import Card, not_served
from ..kernels.device import DeviceProps
from .proposer import TemplateProposer
from .registry import match


def offline_kernels(cards: list[Card], device: DeviceProps | None = None) -> dict[str, str]:
    """card id -> the family that serves it (``generated`` for the generator), for the cards one
    serves on the backend of the device they were profiled on and that the runtime serves
    (``cards.not_served``)."""
    prop = TemplateProposer(device)
    out: dict[str, str] = {}
    for card in cards:
        if not_served(card.kind, card.flags) is not None:
            continue
        backend = "cuda" if card.device == "cuda" else "cpu"
        fam, m = match(card)
        if fam is not None and m is not None and prop.has_point(fam, m, backend):
            out[card.id] = m.family
    return out
