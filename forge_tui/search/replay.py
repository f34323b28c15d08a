"""``forge replay``: the search rebuilt from git history alone, in the order it grew."""

from __future__ import annotations

from ..workspace import Workspace
from .events import Event
from .history import replay_events
from .store import Damage, SearchStore
from .tree import ROOT


def load_replay(ws: Workspace) -> tuple[list[Event], list[Damage]]:
    """The recorded events, and the damaged items left out of them (each with its branch and what is wrong)."""
    with ws.git() as repo:
        loaded = SearchStore(repo).load()
    return replay_events(loaded), loaded.damaged


def load_events(ws: Workspace) -> list[Event]:
    return load_replay(ws)[0]


def format_event(e: Event) -> str:
    d = e.data
    if e.kind == "node_added":
        sp = f"{d['speedup']:.3f}x" if d.get("speedup") else "-"
        head = f"[{e.seq:5d}] {e.card} {e.node}"
        if e.node == ROOT:
            return f"{head} root: eager reference (1.000x)"
        why = f"  ({d['reason'][:100]})" if d.get("status") != "passed" and d.get("reason") else ""
        return f"{head} <- {d['parent']}: {d['status']} {sp}  {d.get('move', '')}{why}"
    if e.kind == "best_improved":
        return f"[{e.seq:5d}] {e.card} best improved: {e.node} {d['speedup']:.3f}x (was {d['previous']:.3f}x)"
    if e.kind == "card_finished":
        return f"[{e.seq:5d}] {e.card} finished: {d.get('reason')}"
    if e.kind == "search_started":
        return (f"[{e.seq:5d}] search {'resumed' if d.get('resumed') else 'started'}: {len(d.get('cards', []))} cards, "
                f"proposer {d.get('proposer')}, backend {d.get('backend')}")
    if e.kind == "search_stopped":
        return f"[{e.seq:5d}] search stopped: {d.get('reason')} ({d.get('evaluations')} evaluations)"
    if e.kind == "proposer_failed":
        return f"[{e.seq:5d}] {e.card} proposer failed at {e.node}: {d.get('reason')}"
    if e.kind == "promotion_requested":
        return f"[{e.seq:5d}] {e.card} promotion requested: {e.node}"
    if e.kind == "store_damaged":
        return Damage(**d).line
    return f"[{e.seq:5d}] {e.kind} {e.card or ''} {e.node or ''}"


def format_trees(events: list[Event]) -> str:
    """Each card's final tree, children under parents in the order they grew."""
    nodes: dict[str, dict[str, dict]] = {}
    for e in events:
        if e.kind == "node_added":
            nodes.setdefault(e.card, {})[e.node] = {"parent": e.data.get("parent"), "data": e.data, "children": []}
    lines = []
    for card, tree in nodes.items():
        for nid, n in tree.items():
            if n["parent"] in tree:
                tree[n["parent"]]["children"].append(nid)
        best = max((n["data"]["speedup"] for nid, n in tree.items() if nid != ROOT and n["data"].get("status") == "passed"
                    and n["data"].get("speedup")), default=None)
        lines.append(f"{card}  ({len(tree) - 1} evaluated" + (f", best {best:.3f}x)" if best else ")"))

        def walk(nid: str, depth: int) -> None:
            n = tree[nid]
            d = n["data"]
            label = "eager reference" if nid == ROOT else (
                f"{d['status']} {d['speedup']:.3f}x" if d.get("speedup") else d["status"])
            lines.append(f"{'  ' * (depth + 1)}{nid} {label}  {'' if nid == ROOT else d.get('move', '')}")
            for c in n["children"]:
                walk(c, depth + 1)

        if ROOT in tree:
            walk(ROOT, 0)
    return "\n".join(lines)
