"""The Proposer interface: given a node and what the search knows, write a child kernel.

Implementations: the built-in template proposer (no LLM), the LLM agent, and the scripted
proposer below (tests, demos, replaying a fixed plan).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

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
    # what the search lends a proposer that works with tools (the LLM agent); None in tests and
    # for proposers that do not need them
    pool: Any = None
    """The search's EvalPool (compile, run the tests, profile)."""
    ledger: Any = None
    """The search's money Ledger (caps per card and per run)."""
    emit: Callable[[Any], None] | None = None
    """Publish a transient event (progress) from the proposer's thread."""
    seq: int = 0
    """The search's sequence number when the expansion started (for the events)."""


@dataclass
class Proposal:
    source: str
    move: str
    """One line: what this child changes (shown in the tree)."""
    meta: dict[str, Any] = field(default_factory=dict)
    transcript: list | None = None
    cost_usd: float = 0.0
    proposer: str | None = None
    """Which proposer wrote it, when one proposer combines several (recorded on the node)."""
    charged: bool = False
    """``cost_usd`` went through the search's ledger already (the agent reserves and settles every
    query); otherwise the search charges it when it records the node."""


class ProposerFailure(Exception):
    """An expansion that produced no child but has a record to keep: the conversation (``transcript``)
    and what it cost. ``stopped``: the proposer will make no more calls this run (a provider that
    keeps failing): the search goes on with what else it has and does not count this against
    the card."""

    def __init__(self, reason: str, *, transcript: list | None = None, cost_usd: float = 0.0,
                 proposer: str | None = None, conversation: str | None = None, stopped: bool = False) -> None:
        super().__init__(reason)
        self.transcript = transcript
        self.cost_usd = cost_usd
        self.proposer = proposer
        self.conversation = conversation
        self.stopped = stopped


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


class CombinedProposer:
    """The LLM agent with a fallback (the templates): the agent writes the children of every node,
    except the root's first child where the fallback serves the card (its heuristic choice, cheap
    and strong, gives the agent a kernel to improve on); the fallback takes over where the agent
    has nothing (it stopped: a provider that keeps failing, a money cap reached)."""

    def __init__(self, agent: Any, fallback: Any) -> None:
        self.agent = agent
        self.fallback = fallback
        self.name = f"{agent.name}+{fallback.name}"

    def supports(self, card: Card, backend: str) -> str | None:
        a = self.agent.supports(card, backend)
        f = self.fallback.supports(card, backend)
        return None if a is None or f is None else f"{a}; {f}"

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        order = [self.agent, self.fallback]
        if ctx.parent.id == "root" and not ctx.children and self.fallback.supports(ctx.card, ctx.backend) is None:
            order.reverse()
        for p in order:
            if p.supports(ctx.card, ctx.backend) is not None:
                continue
            proposal = p.propose(ctx)
            if proposal is not None:
                proposal.proposer = proposal.proposer or p.name
                return proposal
        return None

    # the agent's working files (see AgentProposer)
    def recorded(self, conversation: str) -> None:
        fn = getattr(self.agent, "recorded", None)
        if fn is not None:
            fn(conversation)

    def interrupted(self) -> list:
        fn = getattr(self.agent, "interrupted", None)
        return fn() if fn is not None else []
