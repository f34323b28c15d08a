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
        if g is not None:
            out.append((gen, g))
    return out


def match(card: Card) -> tuple[Family, Match] | tuple[None, None]:
    """(family, match) for the first family that serves the card, else (None, None)."""
    for fam in FAMILIES:
        m = fam.match(card)
        if m is not None:
            return fam, m
    return None, None
