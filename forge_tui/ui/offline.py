"""Which offline kernel serves a card, in one line for the card pane (no Textual: it asks the
templates, which import torch, so the app asks it from a worker)."""

from __future__ import annotations

from ..cards import Card


def offline_line(card: Card) -> str:
    """Which offline proposer serves the card (a template family, or the code generator), or the
    one line that says why none does: the op or the access pattern."""
    from ..templates.proposer import TemplateProposer
    from ..templates.registry import match

    try:
        why = TemplateProposer().supports(card, "cuda" if card.device == "cuda" else "cpu")
        if why is None:
            _, m = match(card)
            return f"offline kernel: {m.family if m is not None else '?'}"
    except Exception as exc:  # noqa: BLE001 - the pane shows the rest of the card regardless
        why = f"the check failed ({type(exc).__name__}: {exc})"
    return f"offline kernel: none ({why})"
