"""From recorded facts to events: one function for the live search and for ``forge replay``, so
a replay yields exactly the persistent events the live run published, in the same order."""

from __future__ import annotations

from .events import Event
from .store import Loaded, LogRecord, NodeRecord
from .tree import OK_STATUSES, ROOT


class History:
    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def node(self, rec: NodeRecord) -> list[Event]:
        data = {"parent": rec.parent, "status": rec.status, "speedup": rec.speedup, "move": rec.move,
                "proposer": rec.proposer, "reason": rec.reason, "cost_usd": rec.cost_usd}
        events = [Event("node_added", rec.seq, rec.card, rec.node, data)]
        if rec.node == ROOT:
            self.best.setdefault(rec.card, 1.0)
        elif rec.status in OK_STATUSES and rec.speedup is not None and rec.speedup > self.best.get(rec.card, 1.0):
            previous = self.best.get(rec.card, 1.0)
            self.best[rec.card] = rec.speedup
            events.append(Event("best_improved", rec.seq, rec.card, rec.node,
                                {"speedup": rec.speedup, "previous": previous}))
        return events

    def log(self, rec: LogRecord) -> list[Event]:
        return [Event(rec.kind, rec.seq, rec.card, rec.node, dict(rec.data))]


def replay_events(loaded: Loaded) -> list[Event]:
    """Every persistent event, in the order the search recorded them."""
    h = History()
    items: list[tuple[int, int, object]] = [(r.seq, 0, r) for r in loaded.nodes] + [(r.seq, 1, r) for r in loaded.log]
    events: list[Event] = []
    for _, _, rec in sorted(items, key=lambda x: (x[0], x[1])):
        events.extend(h.node(rec) if isinstance(rec, NodeRecord) else h.log(rec))
    return events
