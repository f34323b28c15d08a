"""What the describe screen needs from the core's ``forge new`` (an op from a plain-language
description): a draft (a PyTorch reference and example inputs) for a description, and, once the
user approves the draft, a card in the workspace. The screen is written against this protocol;
``CoreDescriber`` is the core's ``forge_tui.describe`` behind it.
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
    ok: bool = True
    """Whether it can become a card (the notes say why not)."""
    handle: object = None
    """The core's own draft object, handed back on approval."""


class Describer(Protocol):
    def draft(self, description: str) -> Draft: ...

    def accept(self, draft: Draft) -> str:
        """Make the draft a card in the workspace; returns the card's id."""
        ...

    def discard(self, draft: Draft) -> None: ...


class Unavailable:
    """A describer that says why there is none (no core implementation here, or no LLM configured)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def draft(self, description: str) -> Draft:
        from ..errors import ForgeError

        raise ForgeError(f"describing an op is not available: {self.why}")

    def accept(self, draft: Draft) -> str:
        return self.draft(draft.description) and ""  # type: ignore[return-value]

    def discard(self, draft: Draft) -> None:
        pass


class CoreDescriber:
    """``forge new`` (``forge_tui.describe``): the LLM agent writes the reference and its example
    inputs in a conversation of its own; an approved draft becomes a card added to the workspace."""

    def __init__(self, workspace: Path, config: Path | None = None, provider: object = None) -> None:
        self.workspace = Path(workspace)
        self.config_path = config
        self.provider = provider
        """Replaces the configured LLM provider (tests, replays)."""
        self.drafts: list[object] = []

    def draft(self, description: str) -> Draft:
        import tempfile

        from ..config import discover_config
        from ..describe import draft_reference

        cfg, _ = discover_config(self.config_path, self.workspace if self.workspace.is_dir() else None)
        workdir = Path(tempfile.mkdtemp(prefix="forge-new-"))
        d = draft_reference(description, cfg, workdir=workdir, provider=self.provider)  # type: ignore[arg-type]
        self.drafts.append(d)
        notes = [f"written by {d.provider} {d.model} (${d.cost_usd:.4f})"]
        if d.summary:
            notes.append(d.summary)
        if not d.ok:
            notes.append(f"cannot become a card: {d.why_not}")
        return Draft(d.description, d.redact(d.source), d.inputs_text(), d.redact("\n".join(notes)), ok=d.ok,
                     handle=d)

    def accept(self, draft: Draft) -> str:
        from ..describe import Draft as CoreDraft
        from ..describe import accept

        d = draft.handle
        assert isinstance(d, CoreDraft)
        try:
            made = accept(d, self.workspace, config_path=self.config_path, approved_by="forge-tui", reuse=True)
        finally:
            d.discard()
        return made.card.id

    def discard(self, draft: Draft) -> None:
        from ..describe import Draft as CoreDraft

        if isinstance(draft.handle, CoreDraft):
            draft.handle.discard()


def describer_for(workspace: Path, config: Path | None = None) -> Describer:
    """The core's describer for a workspace, or one that says why there is none (no LLM agent)."""
    try:
        from ..config import discover_config
        from ..describe import check_agent
    except ImportError:
        return Unavailable("this version has no forge_tui.describe (forge new)")
    try:
        cfg, _ = discover_config(config, workspace if Path(workspace).is_dir() else None)
        check_agent(cfg)
    except Exception as exc:  # noqa: BLE001 - shown on the screen, the app goes on
        return Unavailable(str(exc))
    return CoreDescriber(workspace, config)
