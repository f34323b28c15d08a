"""What the describe screen needs from the core's ``forge new`` (an op from a plain-language
description): a draft (a PyTorch reference and example inputs) for a description, and, once the
user approves the draft, a card in the workspace. The screen is written against this protocol;
``describer_for`` wires it to the core's implementation where that is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class Draft:
    description: str
    reference: str
    """The PyTorch reference the agent wrote (Python source)."""
    inputs: str
    """The example inputs, as a person reads them (shapes, dtypes, how they are drawn)."""
    notes: str = ""
    handle: object = None
    """The core's own draft object, handed back on approval."""


class Describer(Protocol):
    def draft(self, description: str) -> Draft: ...

    def accept(self, draft: Draft) -> str:
        """Make the draft a card in the workspace; returns the card's id."""
        ...


class Unavailable:
    """A describer that says why there is none (no core implementation here, or no LLM configured)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def draft(self, description: str) -> Draft:
        from ..errors import ForgeError

        raise ForgeError(f"describing an op is not available: {self.why}")

    def accept(self, draft: Draft) -> str:
        return self.draft(draft.description) and ""  # type: ignore[return-value]


def describer_for(workspace: Path) -> Describer:
    """The core's describer for a workspace, or one that says why there is none."""
    try:
        from .. import describe  # type: ignore[attr-defined]  # noqa: F401 - the core's forge new, once it lands
    except ImportError:
        return Unavailable("this version has no forge_tui.describe (forge new) yet")
    return Unavailable("forge_tui.describe is here but not yet wired to this screen")
