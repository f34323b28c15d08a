"""The live search tree: one branch per card, nodes under their parents as they land (node id,
proposer, state, speedup), the best marked with a star, failures with their reason."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ...state import ROOT, CardState, NodeState, SearchState

STATUS_STYLE = {"passed": "green", "reference": "", "noisy": "yellow", "rejected": "red", "build_failed": "red",
                "crash": "bold red", "timeout": "red", "error": "red"}


def node_label(n: NodeState, best: bool, ranked: float | None = None) -> Text:
    """``ranked``: the node's speedup as the search ranks the card's kernels (``CardState.ranked``),
    shown in place of its paired ratio, with the kernel's own time where it was recorded."""
    if n.id == ROOT:
        return Text.assemble(("root", "bold"), " eager reference 1.00x")
    t = Text.assemble(("★ " if best else "", "bold yellow"), (n.id, "bold" if best else ""), " ")
    sp = ranked or n.speedup
    if sp:
        t.append(f"{sp:.2f}x ", style=STATUS_STYLE.get(n.status, ""))
    if n.time_us and n.status in ("passed", "noisy"):
        t.append(f"{n.time_us:.1f} µs ", style="dim")
    if n.status != "passed":
        t.append(n.status, style=STATUS_STYLE.get(n.status, ""))
        if n.failed and n.reason:
            t.append(f": {n.reason.splitlines()[0][:60]}", style="dim")
        t.append(" ")
    t.append(n.proposer[:12], style="dim")
    return t


def card_label(c: CardState) -> Text:
    best = f"best {c.best_speedup:.2f}x" if c.best else "no kernel yet"
    state = c.skipped and f"skipped: {c.skipped[:40]}" or c.finished and "finished" or c.state
    return Text.assemble((c.id, "bold"), f"  {best}, {c.evals} evals, {state}")


class SearchTree(Tree[tuple[str, str | None]]):
    """Node data: (card, node id) (node id None on a card's own line)."""

    DEFAULT_CSS = """
    SearchTree { height: 1fr; }
    """

    class NodeChosen(Message):
        def __init__(self, card: str, node: str) -> None:
            super().__init__()
            self.card = card
            self.node = node

    def __init__(self, **kwargs: object) -> None:
        super().__init__("search", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.guide_depth = 2
        self._shown: tuple[object, ...] = ()

    def show_state(self, state: SearchState, only: str | None = None) -> None:
        """Rebuild from the state (kept cursor), only when what it shows changed."""
        key = tuple((cid, len(c.nodes), c.best, c.finished, c.skipped, c.in_flight) for cid, c in state.cards.items()
                    if only is None or cid == only)
        if key == self._shown:
            return
        self._shown = key
        chosen = self.cursor_node.data if self.cursor_node is not None else None
        self.clear()
        at: TreeNode[tuple[str, str | None]] | None = None
        for cid, c in state.cards.items():
            if only is not None and cid != only:
                continue
            top = self.root.add(card_label(c), data=(cid, None), expand=True)
            if chosen == (cid, None):
                at = top

            def add(parent: TreeNode[tuple[str, str | None]], nid: str, c: CardState = c) -> None:
                nonlocal at
                n = c.nodes[nid]
                node = parent.add(node_label(n, nid == c.best, c.ranked().get(nid)), data=(c.id, nid), expand=True,
                                  allow_expand=bool(n.children))
                if chosen == (c.id, nid):
                    at = node
                for child in n.children:
                    if child in c.nodes:
                        add(node, child)

            if ROOT in c.nodes:
                add(top, ROOT)
        if at is not None:
            self.move_cursor(at)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[tuple[str, str | None]]) -> None:
        event.stop()
        data = event.node.data
        if data is not None and data[1] is not None:
            self.post_message(self.NodeChosen(data[0], data[1]))
