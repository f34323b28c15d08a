"""What the app knows of a search, folded from its events: the same fold for a live search and for
a replay (a replay at step k is the fold of the first k events). Plain Python, no Textual: the
widgets read it, the feeds feed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..search.events import (
    AgentInterrupted,
    AgentStep,
    BestImproved,
    BestLost,
    BudgetSpent,
    CardFinished,
    NodeAdded,
    NodeStarted,
    PromotionRequested,
    ProposerFailed,
    SearchEvent,
    SearchStarted,
    SearchStopped,
)
from ..search.tree import pooled_speedups

ROOT = "root"


@dataclass
class NodeState:
    card: str
    id: str
    parent: str | None
    status: str
    speedup: float | None
    move: str = ""
    proposer: str = ""
    reason: str = ""
    cost_usd: float = 0.0
    seq: int = 0
    children: list[str] = field(default_factory=list)
    time_us: float | None = None
    eager_us: float | None = None

    @property
    def failed(self) -> bool:
        return self.status not in ("passed", "reference", "noisy")


@dataclass
class CardState:
    id: str
    nodes: dict[str, NodeState] = field(default_factory=dict)
    best: str | None = None
    best_speedup: float = 1.0
    finished: str | None = None
    skipped: str | None = None
    in_flight: int = 0
    stopped: bool = False
    """The search stopped (a budget, the user) before this card finished."""
    promotion_requested: list[str] = field(default_factory=list)
    proposer_failures: int = 0
    cost_usd: float = 0.0
    _ranked: tuple[int, dict[str, float]] = field(default=(-1, {}), repr=False, compare=False)

    def ranked(self) -> dict[str, float]:
        """Each passed node's speedup as the search ranks it (``tree.pooled_speedups``: eager's
        median over the card's evaluations against the kernel's own time; the paired ratio for a
        node recorded without its times): the number the card's best is shown with, so that a
        node's line and the card's line agree."""
        if self._ranked[0] != len(self.nodes):
            rows = [(n.id, n.status, n.speedup, n.time_us, n.eager_us) for n in self.nodes.values() if n.id != ROOT]
            self._ranked = (len(self.nodes), pooled_speedups(rows))
        return self._ranked[1]

    @property
    def evals(self) -> int:
        return sum(1 for n in self.nodes if n != ROOT)

    @property
    def state(self) -> str:
        """One word or so for the op table's search column."""
        if self.skipped:
            return "skipped"
        if self.finished:
            return "finished"
        if self.in_flight:
            return "searching"
        if self.stopped:
            return "stopped"
        return "queued" if not self.nodes else "waiting"


@dataclass
class SearchState:
    cards: dict[str, CardState] = field(default_factory=dict)
    started: SearchStarted | None = None
    stopped: SearchStopped | None = None
    runs: int = 0
    evaluations: int = 0
    retimes: int = 0
    """Of the evaluations, those that timed a kernel again (``forge retime``)."""
    max_evals: int = 0
    max_wall_s: float = 0.0
    max_cost_usd: float = 0.0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    events: int = 0
    progress: list[tuple[int, str, float]] = field(default_factory=list)
    """(evaluation number, card, the card's best speedup after it): best speedup over evaluations."""

    @property
    def running(self) -> bool:
        return self.started is not None and self.stopped is None

    def card(self, card_id: str) -> CardState:
        if card_id not in self.cards:
            self.cards[card_id] = CardState(card_id)
        return self.cards[card_id]

    def node(self, card_id: str, node_id: str) -> NodeState | None:
        c = self.cards.get(card_id)
        return None if c is None else c.nodes.get(node_id)

    def best(self) -> dict[str, tuple[str, float]]:
        return {cid: (c.best, c.best_speedup) for cid, c in self.cards.items() if c.best}

    def apply(self, e: SearchEvent) -> None:
        """Fold one event in (an event of a kind it does not know is only counted)."""
        self.events += 1
        if isinstance(e, SearchStarted):
            self.started, self.stopped = e, None
            self.runs += 1
            cfg = e.config or {}
            self.max_evals = int(cfg.get("max_evals", self.max_evals) or 0)
            self.max_wall_s = float(cfg.get("max_wall_s", self.max_wall_s) or 0.0)
            self.max_cost_usd = float(cfg.get("max_cost_usd", self.max_cost_usd) or 0.0)
            self.wall_s = 0.0
            for cid in e.cards:
                c = self.card(cid)
                c.skipped, c.finished, c.stopped = None, None, False
            for cid, why in e.skipped.items():
                self.card(cid).skipped = why
        elif isinstance(e, NodeAdded) and e.card and e.node:
            c = self.card(e.card)
            n = NodeState(e.card, e.node, e.parent, e.status, e.speedup, e.move, e.proposer, e.reason, e.cost_usd, e.seq,
                          time_us=e.time_us, eager_us=e.eager_us)
            c.nodes[e.node] = n
            if e.parent and e.parent in c.nodes:
                c.nodes[e.parent].children.append(e.node)
            if e.parent is not None:
                self.evaluations += 1
                self.retimes += e.move.startswith("retime ")
                c.in_flight = max(0, c.in_flight - 1)
                c.cost_usd += e.cost_usd
                self.cost_usd += e.cost_usd
                self.progress.append((self.evaluations, e.card, c.best_speedup if c.best else 1.0))
        elif isinstance(e, BestImproved) and e.card:
            c = self.card(e.card)
            c.best, c.best_speedup = e.node, e.speedup
            if self.progress and self.progress[-1][1] == e.card:
                at, card, _ = self.progress[-1]
                self.progress[-1] = (at, card, e.speedup)
        elif isinstance(e, BestLost) and e.card:
            c = self.card(e.card)
            c.best, c.best_speedup = None, 1.0
            if self.progress and self.progress[-1][1] == e.card:
                at, card, _ = self.progress[-1]
                self.progress[-1] = (at, card, 1.0)
        elif isinstance(e, CardFinished) and e.card:
            self.card(e.card).finished = e.reason
        elif isinstance(e, ProposerFailed) and e.card:
            c = self.card(e.card)
            c.proposer_failures += 1
            c.in_flight = max(0, c.in_flight - 1)
            c.cost_usd += e.cost_usd
            self.cost_usd += e.cost_usd
        elif isinstance(e, AgentInterrupted) and e.card:
            self.card(e.card).cost_usd += e.cost_usd
            self.cost_usd += e.cost_usd
        elif isinstance(e, PromotionRequested) and e.card and e.node:
            self.card(e.card).promotion_requested.append(e.node)
        elif isinstance(e, SearchStopped):
            self.stopped = e
            for c in self.cards.values():
                c.in_flight = 0
                c.stopped = c.finished is None and c.skipped is None
        elif isinstance(e, NodeStarted) and e.card:
            self.card(e.card).in_flight += 1
        elif isinstance(e, BudgetSpent):
            self.evaluations = max(self.evaluations, e.evaluations)
            self.max_evals = e.max_evals or self.max_evals
            self.cost_usd = max(self.cost_usd, e.cost_usd)
            self.wall_s = e.wall_s
        elif isinstance(e, AgentStep):
            pass  # the transcript pane reads the committed transcript; the log shows a step

    def interrupted(self) -> None:
        """A recorded history whose last run has no stop (the app quit, or the process was killed,
        during it): that run is shown stopped, not as still searching."""
        if self.running:
            self.apply(SearchStopped(seq=self.events, reason="interrupted: the run ended without recording a stop",
                                     evaluations=self.evaluations, cost_usd=self.cost_usd))

    @classmethod
    def of(cls, events: list[SearchEvent]) -> "SearchState":
        s = cls()
        for e in events:
            s.apply(e)
        return s

    def budgets(self) -> list[tuple[str, float, float, str]]:
        """(name, spent, limit, text) for evaluations, wall time and money."""
        retimes = f" ({self.retimes} of them retimes)" if self.retimes else ""
        out = [("evaluations", float(self.evaluations), float(self.max_evals or 0),
                f"{self.evaluations} of {self.max_evals or '-'}{retimes}")]
        if self.max_wall_s:
            out.append(("wall time", self.wall_s, self.max_wall_s, f"{self.wall_s:.0f} of {self.max_wall_s:.0f} s"))
        out.append(("money", self.cost_usd, self.max_cost_usd, f"${self.cost_usd:.2f} of ${self.max_cost_usd:.2f}"))
        return out

    def summary(self) -> str:
        if self.started is None:
            return "no search yet"
        best = [f"{cid} {sp:.2f}x" for cid, (_, sp) in self.best().items()]
        head = "searching" if self.running else f"stopped: {self.stopped.reason if self.stopped else ''}"
        return f"{head}; {self.evaluations} evaluations; best " + (", ".join(best) or "eager everywhere")


def points(state: SearchState) -> list[tuple[str, float, float]]:
    """(card, cost in dollars, speedup) for every passed node: cost against speedup (as the search
    ranks the card's kernels, ``CardState.ranked``)."""
    out = []
    for c in state.cards.values():
        ranked = c.ranked()
        for n in c.nodes.values():
            if n.id != ROOT and n.status == "passed" and n.id in ranked:
                out.append((c.id, n.cost_usd, ranked[n.id]))
    return out


def as_dict(state: SearchState) -> dict[str, Any]:
    """A small summary (tests, the tmux check)."""
    return {"evaluations": state.evaluations, "best": state.best(), "running": state.running}
