"""The Proposer interface: given a node and what the search knows, write a child kernel.

Implementations: the built-in template proposer (no LLM), the LLM agent, and the scripted
proposer below (tests, demos, replaying a fixed plan).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..cards import Card, id_matches
from ..evaluator.result import EvalResult


@dataclass
class NodeView:
    """What a proposer sees of one node."""

    id: str
    parent: str | None
    status: str
    speedup: float | None
    move: str
    reason: str = ""
    source: str | None = None
    result: EvalResult | None = None


@dataclass
class ProposalContext:
    card: Card
    backend: str
    parent: NodeView
    lineage: list[NodeView]
    """Root first, ending with the parent."""
    best: NodeView | None
    improvements: list[NodeView]
    """Recent nodes of this card that beat the best before them, newest last."""
    regressions: list[NodeView]
    """Recent nodes slower than their parent."""
    failed_siblings: list[NodeView]
    """The parent's children that failed, with their reasons (learn from them)."""
    children: list[NodeView]
    """Every existing child of the parent (do not propose one of these again)."""
    reference_source: str
    """The card's reference as Python (what eager computes)."""
    tree_moves: list[str] = field(default_factory=list)
    """The move of every node already in this card's tree."""


@dataclass
class Proposal:
    source: str
    move: str
    """One line: what this child changes (shown in the tree)."""
    meta: dict[str, Any] = field(default_factory=dict)
    transcript: list | None = None
    cost_usd: float = 0.0


class Proposer(Protocol):
    name: str

    def supports(self, card: Card, backend: str) -> str | None:
        """None when this proposer can write kernels for the card; else why not."""

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        """A child of ``ctx.parent``, or None when it has nothing more for that node."""


class ScriptedProposer:
    """Proposals from a fixed list per card (by card-id prefix), in order, whatever the parent.

    Plan file (JSON)::

        {"delay_s": 0.1,
         "cards": {"_softmax": ["a.cpp", {"file": "b.cpp", "move": "vectorised"}]},
         "default": ["generic.cpp"]}

    Paths are relative to the plan file. ``fail`` entries raise (to test proposer failures).
    """

    name = "scripted"

    def __init__(self, plan: dict, base: Path | None = None) -> None:
        self.delay_s = float(plan.get("delay_s", 0.0))
        self.base = base or Path(".")
        self.cards: dict[str, list] = {k: list(v) for k, v in plan.get("cards", {}).items()}
        self.default = list(plan.get("default", []))
        self._used: dict[str, int] = {}

    @classmethod
    def from_file(cls, path: Path) -> "ScriptedProposer":
        return cls(json.loads(Path(path).read_text()), Path(path).parent)

    def _entries(self, card_id: str) -> list | None:
        for prefix, entries in self.cards.items():
            if id_matches(card_id, prefix):
                return entries
        return self.default or None

    def supports(self, card: Card, backend: str) -> str | None:
        return None if self._entries(card.id) else "the plan has no entries for this card"

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        entries = self._entries(ctx.card.id) or []
        i = self._used.get(ctx.card.id, 0)
        # resumable: skip entries whose move already exists in the tree
        done = set(ctx.tree_moves)
        while i < len(entries):
            entry = entries[i]
            i += 1
            if isinstance(entry, str):
                entry = {"file": entry}
            move = entry.get("move") or f"scripted #{i}: {entry.get('file', 'inline')}"
            if move in done and not entry.get("repeat"):
                continue
            self._used[ctx.card.id] = i
            if self.delay_s:
                time.sleep(self.delay_s)
            if entry.get("fail"):
                raise RuntimeError(entry["fail"])
            source = entry["source"] if "source" in entry else (self.base / entry["file"]).read_text()
            return Proposal(source=source, move=move, meta={"entry": i}, cost_usd=float(entry.get("cost_usd", 0.0)))
        self._used[ctx.card.id] = i
        return None
