"""Every template family, in the order they are tried on a card."""

from __future__ import annotations

from ..cards import Card
from .base import Family, Match
from .families.elementwise import Elementwise
from .families.groupnorm import BatchNorm, GroupNorm
from .families.pooling import MaxPool, MeanPool
from .families.rownorm import RowNorm
from .families.softmax import Softmax

FAMILIES: list[Family] = [Softmax(), RowNorm(), GroupNorm(), BatchNorm(), MeanPool(), MaxPool(), Elementwise()]
BY_NAME = {f.name: f for f in FAMILIES}


def match(card: Card) -> tuple[Family, Match] | tuple[None, None]:
    """(family, match) for the first family that serves the card, else (None, None)."""
    for fam in FAMILIES:
        m = fam.match(card)
        if m is not None:
            return fam, m
    return None, None
