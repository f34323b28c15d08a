"""Selection: UCT on the normalised reward, with progressive widening.

From the root, a node is expanded (asked for a new child) while it has fewer children than
``k * visits ** alpha``; otherwise the search descends to the child with the highest
``value + c * sqrt(ln(N_parent) / N_child)``. Failed nodes stay in the tree (proposers learn
from them) but are never expanded or descended into.
"""

from __future__ import annotations

import math

from .tree import CardTree, Node


def widen_limit(visits: int, k: float, alpha: float) -> int:
    return max(1, math.floor(k * max(visits, 1) ** alpha))


def uct_score(child: Node, parent_visits: int, c: float) -> float:
    n = child.visits + child.virtual
    if n == 0:
        return math.inf
    return child.value + c * math.sqrt(math.log(max(parent_visits, 1)) / n)


def select(tree: CardTree, c: float, k: float, alpha: float) -> Node | None:
    """The node to expand next, or None when nothing in the tree can be expanded."""
    root = tree.root
    if root is None:
        return None
    while not root.dead:
        node = root
        while True:
            visits = node.visits + node.virtual
            if node.expandable and len(node.children) + node.pending < widen_limit(visits, k, alpha):
                return node
            open_children = [tree.nodes[i] for i in node.children if not tree.nodes[i].dead]
            if not open_children:
                if node.expandable:
                    return node  # widen beyond the limit rather than stop
                node.dead = True
                break  # start again from the root
            node = max(open_children, key=lambda ch: (uct_score(ch, visits, c), -ch.seq))
    return None
