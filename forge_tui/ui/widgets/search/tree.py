"""The live search tree: the searched cards first, each expanded with its nodes under their parents
as they land (node id, speedup, state, proposer; the best starred, failures with their reason),
then every card the search left out under one collapsed "not searched (N)" line whose children
each say why. Nodes are added and relabelled in place, so the cursor stays on the node it is on
while the tree grows; the line under the cursor is shown in full below the tree.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from ...state import ROOT, CardState, NodeState, SearchState

STATUS_STYLE = {"passed": "green", "reference": "", "noisy": "yellow", "rejected": "red", "build_failed": "red",
                "crash": "bold red", "timeout": "red", "error": "red"}
REASON_WIDTH = 60
"""A failure's reason in a node's line is cut here; the detail line under the tree shows it whole."""

Key = tuple[str, str | None]


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
            first = n.reason.splitlines()[0]
            t.append(": " + (first if len(first) <= REASON_WIDTH else first[:REASON_WIDTH - 1] + "…"), style="dim")
        t.append(" ")
    t.append("retime" if n.move.startswith("retime ") else n.proposer[:12], style="dim")
    return t


def node_detail(card: str, n: NodeState, ranked: float | None = None) -> str:
    """A node's line in full: what the tree's line cuts."""
    if n.id == ROOT:
        return f"{card} root: the eager reference (the fallback), 1.00x"
    sp = ranked or n.speedup
    speed = f" {sp:.3f}x eager" if sp else ""
    times = f" ({n.time_us:.1f} µs" + (f" against eager's {n.eager_us:.1f}" if n.eager_us else "") + ")" \
        if n.time_us else ""
    why = f": {n.reason}" if n.reason and n.status != "passed" else ""
    return f"{card} {n.id} <- {n.parent}: {n.status}{speed}{times}; {n.move} ({n.proposer}){why}"


def card_label(c: CardState, name: str = "") -> Text:
    best = f"best {c.best_speedup:.2f}x" if c.best else "no kernel yet"
    state = c.skipped and "skipped" or c.finished and "finished" or c.state
    return Text.assemble((name or c.id, "bold"), f"  {best}, {c.evals} evals, {state}")


def card_detail(c: CardState, name: str = "") -> str:
    head = f"{name} ({c.id})" if name and name != c.id else c.id
    if c.skipped:
        return f"{head}: not searched: {c.skipped}"
    best = f"best {c.best} {c.best_speedup:.3f}x eager" if c.best else "no kernel faster than eager yet"
    end = f"; finished: {c.finished}" if c.finished else f"; {c.state}"
    return f"{head}: {best}, {c.evals} evaluations{end}"


def skipped_label(c: CardState, name: str = "") -> Text:
    return Text.assemble((name or c.id, "bold"), (f": {c.skipped}", "dim"))


class SearchTree(Tree[Key]):
    """Node data: (card, node id) (node id None on a card's own line; the "not searched" line has
    no data)."""

    DEFAULT_CSS = """
    SearchTree { height: 1fr; }
    """

    class NodeChosen(Message):
        def __init__(self, card: str, node: str) -> None:
            super().__init__()
            self.card = card
            self.node = node

    class LineShown(Message):
        """The cursor's line in full (the detail line under the tree shows it)."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs: object) -> None:
        super().__init__("search", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.guide_depth = 2
        self.names: dict[str, str] = {}
        """Card id -> a readable name (``table.display_name``), where the app knows the card."""
        self._layout: tuple[object, ...] = ()
        self._by_key: dict[Key, TreeNode[Key]] = {}
        self._group: TreeNode[Key] | None = None
        self._state: SearchState = SearchState()

    def show_state(self, state: SearchState, only: str | None = None) -> None:
        """Show the state: nodes that landed are added where they belong and labels that changed
        are set, the rest untouched (the cursor stays where it is); a change of which cards are
        searched, or of ``only`` (one card), lays the tree out again, the cursor kept on its node."""
        self._state = state
        cards = [(cid, c) for cid, c in state.cards.items() if only is None or cid == only]
        searched = tuple(cid for cid, c in cards if not c.skipped)
        skipped = tuple(cid for cid, c in cards if c.skipped)
        layout = (searched, skipped, only)
        if layout != self._layout:
            self._rebuild(state, searched, skipped)
            self._layout = layout
            return
        for cid in searched:
            self._grow(state.cards[cid])
        for cid in skipped:
            self._relabel(self._by_key[(cid, None)], skipped_label(state.cards[cid], self.names.get(cid, "")))
        self._announce()

    def _rebuild(self, state: SearchState, searched: tuple[str, ...], skipped: tuple[str, ...]) -> None:
        chosen = self.cursor_node.data if self.cursor_node is not None else None
        group_open = self._group is not None and self._group.is_expanded
        self.clear()
        self._by_key = {}
        self._group = None
        for cid in searched:
            c = state.cards[cid]
            self._by_key[(cid, None)] = self.root.add(card_label(c, self.names.get(cid, "")), data=(cid, None),
                                                     expand=True)
            self._grow(c)
        if skipped:
            self._group = self.root.add(Text(f"not searched ({len(skipped)})", style="dim"), expand=group_open)
            for cid in skipped:
                self._by_key[(cid, None)] = self._group.add_leaf(
                    skipped_label(state.cards[cid], self.names.get(cid, "")), data=(cid, None))
        at = self._by_key.get(chosen) if chosen is not None else None
        if at is not None:
            if at.parent is self._group and self._group is not None:
                self._group.expand()
            self.call_after_refresh(self.move_cursor, at)
        else:
            self.call_after_refresh(self._announce)

    def _grow(self, c: CardState) -> None:
        """The card's new nodes added under their parents, its changed labels set."""
        top = self._by_key[(c.id, None)]
        self._relabel(top, card_label(c, self.names.get(c.id, "")))
        ranked = c.ranked()
        for nid, n in c.nodes.items():
            label = node_label(n, nid == c.best, ranked.get(nid))
            node = self._by_key.get((c.id, nid))
            if node is None:
                parent = top if n.parent is None else self._by_key.get((c.id, n.parent), top)
                node = parent.add(label, data=(c.id, nid), expand=True, allow_expand=False)
                parent.allow_expand = True
                self._by_key[(c.id, nid)] = node
            else:
                self._relabel(node, label)

    @staticmethod
    def _relabel(node: TreeNode[Key], label: Text) -> None:
        if node.label != label:
            node.set_label(label)

    def full_text(self, node: TreeNode[Key] | None) -> str:
        """The line's text in full (a node's reason uncut, a card's state and why it was left out)."""
        if node is None:
            return ""
        data = node.data
        if data is None:
            return (f"{len(node.children)} cards the search left out, each with its reason "
                    "(Enter or a click opens the list)")
        card, nid = data
        c = self._state.cards.get(card)
        if c is None:
            return card
        if nid is None:
            return card_detail(c, self.names.get(card, ""))
        n = c.nodes.get(nid)
        return node_detail(card, n, c.ranked().get(nid)) if n is not None else f"{card} {nid}"

    def _announce(self) -> None:
        self.post_message(self.LineShown(self.full_text(self.cursor_node)))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[Key]) -> None:
        event.stop()
        self.post_message(self.LineShown(self.full_text(event.node)))
        data = event.node.data
        if data is not None and data[1] is not None:
            self.post_message(self.NodeChosen(data[0], data[1]))


class TreePane(Vertical):
    """The tree and, under it, the cursor's line in full (wrapped)."""

    DEFAULT_CSS = """
    TreePane { height: 1fr; }
    TreePane > #tree-line { height: auto; max-height: 4; padding: 0 1; background: $boost; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield SearchTree(id="search-tree")
        yield Static("", id="tree-line", markup=False)

    def on_search_tree_line_shown(self, event: SearchTree.LineShown) -> None:
        event.stop()
        self.query_one("#tree-line", Static).update(event.text)
