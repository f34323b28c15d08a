"""The rewrites of the model's own code, and their registry: ``REWRITES``, by name.

A rewrite changes how a part of the model computes rather than serving one op with a kernel:
``fold`` (batch norms folded into their convolutions), ``experts`` (routed mixture-of-experts
blocks in one grouped pass) and ``merge`` (sibling linears in one batched product). Each has its
module here (``fold.py``, ``experts.py``, ``merge.py``: propose, check, time and promote its cards,
over the shared steps in ``base.py``) and its runtime half under ``forge_tui/runtime/`` (the
serving code and its installer in ``runtime/kinds/``, named by ``Rewrite.installer``).

Everything that runs or tells apart the rewrites reads this registry rather than naming them: the
CLI makes one subcommand per entry, the app's ``m`` runs them in order, the search leaves out the
cards their promoted cards replace, and the bench runs them and weighs their cards. The runtime
never imports this package; it serves a rewrite's cards by their kind, through its own ``KINDS``.
"""

from __future__ import annotations

from . import experts, fold, merge
from .base import Rewrite, RewriteCard

__all__ = ["REWRITES", "Rewrite", "RewriteCard"]

REWRITES: dict[str, Rewrite] = {r.name: r for r in (fold.REWRITE, experts.REWRITE, merge.REWRITE)}
"""Every rewrite by name, in the order the app and the bench run them: the folds first, then the
experts, then the merges (which leave the linears inside experts blocks to ``experts``)."""
