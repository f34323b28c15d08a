"""Every template family, in the order they are tried on a card (the generated kernels last)."""

from __future__ import annotations

from ..cards import Card
from ..codegen import Generated
from ..kernels.family import Family, Match
from .families.batch_norm import BatchNorm
from .families.elementwise import Elementwise
from .families.group_norm import GroupNorm
from .families.pooling import MaxPool, MeanPool
from .families.rownorm import RowNorm
from .families.softmax import Softmax

# the hand-written families first; the generator (forge_tui/codegen) serves what none of them matches
FAMILIES: list[Family] = [Softmax(), RowNorm(), GroupNorm(), BatchNorm(), MeanPool(), MaxPool(), Elementwise(),
                          Generated()]
BY_NAME = {f.name: f for f in FAMILIES}


def matches(card: Card) -> list[tuple[Family, Match]]:
    """The first family that serves the card and, where that is a hand-written one, the generated
    family too if it serves the card: the search tries the hand-written family's first choice
    first and the generator's next, and each node's children stay in its own family."""
    fam, m = match(card)
    if fam is None or m is None:
        return []
    out: list[tuple[Family, Match]] = [(fam, m)]
    gen = FAMILIES[-1]
    if fam is not gen:
        g = gen.match(card)
        if g is not None and (not card.ranges or gen.range_reason(g) is None):
            out.append((gen, g))
    return out


def match(card: Card) -> tuple[Family, Match] | tuple[None, None]:
    """(family, match) for the first family that serves the card, else (None, None). A range card
    is served only by a family whose kernels take its ranged sizes at run time
    (``Family.range_reason``); ``range_refusals`` says why the others do not."""
    for fam in FAMILIES:
        m = fam.match(card)
        if m is not None and (not card.ranges or fam.range_reason(m) is None):
            return fam, m
    return None, None


def range_refusals(card: Card) -> list[str]:
    """Why each family that computes a range card cannot serve its range, one line each (the
    card's own reason first, where no kernel could: ``ranges.range_reason``)."""
    from ..ranges import range_reason

    out = [why] if (why := range_reason(card)) else []
    for fam in FAMILIES:
        m = fam.match(card)
        if m is not None and (why := fam.range_reason(m)) is not None:
            out.append(why)
    return out
