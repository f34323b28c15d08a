"""``forge replay``: the search rebuilt from git history alone, in the order it grew."""

from __future__ import annotations

from ..workspace import Workspace
from .events import NodeAdded, SearchEvent
from .history import replay_events
from .store import Damage, SearchStore
from .tree import ROOT


def load_replay(ws: Workspace) -> tuple[list[SearchEvent], list[Damage]]:
    """The recorded events, and the damaged items left out of them (each with its branch and what is wrong)."""
    with ws.git() as repo:
        loaded = SearchStore(repo).load()
    return replay_events(loaded), loaded.damaged


def load_events(ws: Workspace) -> list[SearchEvent]:
    return load_replay(ws)[0]


def format_event(e: SearchEvent) -> str:
    return e.line()


def format_trees(events: list[SearchEvent]) -> str:
    """Each card's final tree, children under parents in the order they grew."""
    nodes: dict[str, dict[str, dict]] = {}
    for e in events:
        if isinstance(e, NodeAdded):
            nodes.setdefault(e.card or "", {})[e.node or ""] = {"parent": e.parent, "data": e.data, "children": []}
    lines = []
    for card, tree in nodes.items():
        for nid, n in tree.items():
            if n["parent"] in tree:
                tree[n["parent"]]["children"].append(nid)
        best = max((n["data"]["speedup"] for nid, n in tree.items() if nid != ROOT and n["data"].get("status") == "passed"
                    and n["data"].get("speedup")), default=None)
        lines.append(f"{card}  ({len(tree) - 1} evaluated" + (f", best {best:.3f}x)" if best else ")"))

        def walk(nid: str, depth: int, tree: dict[str, dict] = tree) -> None:
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
