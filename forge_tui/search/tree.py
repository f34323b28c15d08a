"""One search tree per card: nodes, normalised rewards, max-backup of values."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

ROOT = "root"
OK_STATUSES = ("passed", "reference")
EXPANDABLE_STATUSES = OK_STATUSES + ("noisy",)
"""A noisy node is correct but its speed is unknown (the machine was busy): it can have children,
it earns the neutral reward of eager speed, and it is never the best."""
NEUTRAL_REWARD = 0.5


def reward(status: str, speedup: float | None, cap: float) -> float:
    """0.5 at the eager speed (the root), 1 at ``cap`` times faster, 0 at ``cap`` times slower;
    0 for a candidate that failed."""
    if status == "noisy":
        return NEUTRAL_REWARD
    if status not in OK_STATUSES or not speedup or speedup <= 0:
        return 0.0
    x = math.log(speedup) / math.log(cap)
    return 0.5 + 0.5 * max(-1.0, min(1.0, x))


def pooled_speedups(nodes: Iterable[tuple[str, str, float | None, float | None, float | None]]) -> dict[str, float]:
    """Each passed node's speedup against eager's time pooled over the card's evaluations: the
    median of every passed evaluation's eager time over the node's own time. ``nodes``: (id,
    status, paired speedup, time µs, eager µs) of one card's nodes.

    What ranks a card's kernels. Each evaluation's ratio divides by its own sample of eager, and
    eager's many launches make that sample the noisier one: its spread across one search's
    evaluations can exceed the candidates' differences, and then the largest ratio is not the
    fastest kernel (docs/benchmarks.md has the norm cards that promoted a slower kernel so).
    Pooled, eager is one number a card and the ranking is the candidates' own times. A node
    without its times (recorded before nodes carried them) keeps its ratio."""
    rows = list(nodes)
    eagers = sorted(e for _, status, _, _, e in rows if status == "passed" and e)
    pooled = eagers[len(eagers) // 2] if eagers else None
    out: dict[str, float] = {}
    for nid, status, speedup, time_us, eager_us in rows:
        if status != "passed" or not speedup:
            continue
        out[nid] = pooled / time_us if pooled and time_us and eager_us else speedup
    return out


def faster_than_eager(nodes: Iterable[tuple[str, str, float | None, float | None, float | None]],
                      pooled: dict[str, float] | None = None) -> dict[str, float]:
    """The nodes that beat eager, each with the speedup the card ranks it by: a passed node whose
    ratio against eager pooled over the card (``pooled_speedups``) and whose paired ratio (its own
    evaluation's verdict, eager and the kernel timed side by side) both exceed 1. On a loaded
    machine the two can fall on either side of 1 (eager and the kernel slow down together, pair by
    pair, while their medians lie far apart): neither alone makes a kernel faster. The one rule
    for the card's best (the app's star), its promotion request, and the search's best.
    ``nodes``: as ``pooled_speedups``'; ``pooled``: its answer for them, where the caller has it."""
    rows = list(nodes)
    paired = {nid: speedup for nid, _, speedup, _, _ in rows}
    ranked = pooled_speedups(rows) if pooled is None else pooled
    return {nid: sp for nid, sp in ranked.items() if sp > 1.0 and (paired.get(nid) or 0.0) > 1.0}


@dataclass
class Node:
    card: str
    id: str
    parent: str | None
    seq: int
    status: str
    speedup: float | None
    move: str = ""
    proposer: str = ""
    commit: str = ""
    cost_usd: float = 0.0
    reason: str = ""
    children: list[str] = field(default_factory=list)
    visits: int = 0
    virtual: int = 0
    pending: int = 0
    """Children being proposed or evaluated right now."""
    value: float = 0.0
    """Best reward in this node's subtree (max-backup)."""
    expandable: bool = True
    """False once the proposer has no more children for it, or the node failed."""
    dead: bool = False
    """Nothing below it can be expanded any more."""
    time_us: float | None = None
    eager_us: float | None = None
    """The candidate's and eager's median times in its evaluation (see ``pooled_speedups``)."""

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES


class CardTree:
    def __init__(self, card_id: str, cap: float) -> None:
        self.card_id = card_id
        self.cap = cap
        self.nodes: dict[str, Node] = {}

    @property
    def root(self) -> Node | None:
        return self.nodes.get(ROOT)

    def add(self, node: Node) -> None:
        """Insert a node and back its reward up to the root (visits, max value)."""
        if node.id in self.nodes:
            return
        self.nodes[node.id] = node
        r = reward(node.status, node.speedup, self.cap)
        node.value = r
        if node.status not in EXPANDABLE_STATUSES:
            node.expandable = False
            node.dead = True
        if node.parent is not None and node.parent in self.nodes:
            self.nodes[node.parent].children.append(node.id)
        cur: Node | None = node
        while cur is not None:
            cur.visits += 1
            cur.value = max(cur.value, r)
            cur = self.nodes.get(cur.parent) if cur.parent else None

    def lineage(self, node_id: str) -> list[Node]:
        out = []
        cur = self.nodes.get(node_id)
        while cur is not None:
            out.append(cur)
            cur = self.nodes.get(cur.parent) if cur.parent else None
        return out[::-1]

    def wins(self) -> dict[str, float]:
        """``faster_than_eager`` of the card's nodes."""
        return faster_than_eager((n.id, n.status, n.speedup, n.time_us, n.eager_us) for n in self.nodes.values())

    def best(self) -> Node | None:
        """The fastest node that beats eager (``faster_than_eager``), else the root (eager)."""
        wins = self.wins()
        if wins:
            return max((self.nodes[nid] for nid in wins), key=lambda n: (wins[n.id], -n.seq))
        return self.nodes.get(ROOT)

    def evaluated(self) -> int:
        return sum(1 for n in self.nodes.values() if n.id != ROOT)

    def add_virtual(self, node_id: str, delta: int) -> None:
        """Virtual visits along the path of an evaluation in flight, so parallel selections spread."""
        for n in self.lineage(node_id):
            n.virtual = max(0, n.virtual + delta)
