"""Every aten op the generator lowers, one function an op in a table (registry.LOWERINGS), the
functions grouped by kind: pointwise ops, copies and constants (pointwise.py), views, splits and
joins (shapes.py), reductions (reductions.py), normalisations (norms.py). Ops in UNARY and BINARY
without a lowering of their own take the generic one of their arity."""

from __future__ import annotations

from . import norms, pointwise, reductions, shapes  # noqa: F401 - each module registers its lowerings
from .registry import BINARY, IDENTITY_VIEWS, LOWERINGS, UNARY, out_type, register

for _name in UNARY:
    LOWERINGS.setdefault(_name, pointwise.unary)
for _name in BINARY:
    LOWERINGS.setdefault(_name, pointwise.binary)

__all__ = ["BINARY", "IDENTITY_VIEWS", "LOWERINGS", "UNARY", "out_type", "register"]
