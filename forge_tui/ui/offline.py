"""Which offline kernel serves a card, in one line for the card pane (no Textual). It reads the
card's coverage; a card made outside a workspace has none, and then the templates are asked, which
import torch, so the app asks from a worker."""

from __future__ import annotations

from ..cards import Card


def offline_line(card: Card) -> str:
    """Which offline proposer serves the card (a template family, or the code generator), or the
    one line that says why none does: the op or the access pattern."""
    cov = card.coverage
    if cov is None:
        from ..templates.coverage import coverage_of

        cov = coverage_of(card)
    if cov.proposer != "agent":
        return f"offline kernel: {cov.family or '?'}"
    return f"offline kernel: none ({cov.why_not})"
