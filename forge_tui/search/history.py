"""From recorded facts to events: one function for the live search and for ``forge replay``, so
a replay yields exactly the persistent events the live run published, in the same order."""

from __future__ import annotations

from .events import BestImproved, BestLost, NodeAdded, SearchEvent, make_event
from .store import Loaded, LogRecord, NodeRecord
from .tree import OK_STATUSES, ROOT, faster_than_eager, pooled_speedups


class History:
    def __init__(self) -> None:
        self.best: dict[str, float] = {}
        self.best_node: dict[str, str] = {}
        self.timed: dict[str, list[tuple[str, str, float | None, float | None, float | None]]] = {}

    def node(self, rec: NodeRecord) -> list[SearchEvent]:
        """NodeAdded; BestImproved when the card's best (``CardTree.best``: the fastest of
        ``faster_than_eager``) becomes another node; BestLost when it becomes none (this
        evaluation's eager moved the card's pooled median so that no kernel beats eager)."""
        events: list[SearchEvent] = [NodeAdded(seq=rec.seq, card=rec.card, node=rec.node, parent=rec.parent,
                                               status=rec.status, speedup=rec.speedup, move=rec.move,
                                               proposer=rec.proposer, reason=rec.reason, cost_usd=rec.cost_usd,
                                               time_us=rec.time_us, eager_us=rec.eager_us)]
        if rec.node == ROOT:
            self.best.setdefault(rec.card, 1.0)
            return events
        if rec.status not in OK_STATUSES or rec.speedup is None:
            return events
        rows = self.timed.setdefault(rec.card, [])
        rows.append((rec.node, rec.status, rec.speedup, rec.time_us, rec.eager_us))
        score = faster_than_eager(rows)
        top = max(score, key=lambda n: score[n], default=None)  # the first of equals: the earliest
        previous = self.best.get(rec.card, 1.0)
        if top is not None and top != self.best_node.get(rec.card):
            self.best[rec.card], self.best_node[rec.card] = score[top], top
            events.append(BestImproved(seq=rec.seq, card=rec.card, node=top, speedup=score[top], previous=previous))
        elif top is not None and top == self.best_node.get(rec.card):
            self.best[rec.card] = score[top]  # eager pooled over one more evaluation
        elif top is None and (lost := self.best_node.pop(rec.card, None)) is not None:
            self.best[rec.card] = 1.0
            now = pooled_speedups(rows).get(lost)
            events.append(BestLost(seq=rec.seq, card=rec.card, node=lost, speedup=now, previous=previous))
        return events

    def log(self, rec: LogRecord) -> list[SearchEvent]:
        return [make_event(rec.kind, rec.seq, rec.card, rec.node, dict(rec.data))]


def replay_events(loaded: Loaded) -> list[SearchEvent]:
    """Every persistent event, in the order the search recorded them."""
    h = History()
    items: list[tuple[int, int, object]] = [(r.seq, 0, r) for r in loaded.nodes] + [(r.seq, 1, r) for r in loaded.log]
    events: list[SearchEvent] = []
    for _, _, rec in sorted(items, key=lambda x: (x[0], x[1])):
        if isinstance(rec, NodeRecord):
            events.extend(h.node(rec))
        elif isinstance(rec, LogRecord):
            events.extend(h.log(rec))
    return events
