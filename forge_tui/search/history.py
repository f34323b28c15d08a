"""From recorded facts to events: one function for the live search and for ``forge replay``, so
a replay yields exactly the persistent events the live run published, in the same order."""

from __future__ import annotations

from .events import BestImproved, NodeAdded, SearchEvent, make_event
from .store import Loaded, LogRecord, NodeRecord
from .tree import OK_STATUSES, ROOT


class History:
    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def node(self, rec: NodeRecord) -> list[SearchEvent]:
        events: list[SearchEvent] = [NodeAdded(seq=rec.seq, card=rec.card, node=rec.node, parent=rec.parent,
                                               status=rec.status, speedup=rec.speedup, move=rec.move,
                                               proposer=rec.proposer, reason=rec.reason, cost_usd=rec.cost_usd)]
        if rec.node == ROOT:
            self.best.setdefault(rec.card, 1.0)
        elif rec.status in OK_STATUSES and rec.speedup is not None and rec.speedup > self.best.get(rec.card, 1.0):
            previous = self.best.get(rec.card, 1.0)
            self.best[rec.card] = rec.speedup
            events.append(BestImproved(seq=rec.seq, card=rec.card, node=rec.node, speedup=rec.speedup,
                                       previous=previous))
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
