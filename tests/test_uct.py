"""Selection on known trees: UCT scores, progressive widening, failed and exhausted nodes."""

import math

from forge_tui.search.tree import ROOT, CardTree, Node, reward
from forge_tui.search.uct import select, uct_score, widen_limit


def build(spec):
    """spec: list of (id, parent, status, speedup)."""
    t = CardTree("c", cap=4.0)
    for seq, (nid, parent, status, speedup) in enumerate(spec):
        t.add(Node("c", nid, parent, seq, status, speedup))
    return t


def test_reward_normalisation():
    assert reward("reference", 1.0, 4.0) == 0.5
    assert reward("passed", 4.0, 4.0) == 1.0 and reward("passed", 16.0, 4.0) == 1.0
    assert reward("passed", 0.25, 4.0) == 0.0
    assert reward("passed", 2.0, 4.0) == 0.75
    assert reward("rejected", None, 4.0) == 0.0


def test_max_backup_and_visits():
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 2.0), ("b", ROOT, "passed", 0.5),
               ("a1", "a", "passed", 4.0), ("a2", "a", "rejected", None)])
    assert t.nodes[ROOT].visits == 5 and t.nodes["a"].visits == 3
    assert t.nodes["a"].value == 1.0 and t.nodes[ROOT].value == 1.0  # best reward in the subtree
    assert t.nodes["b"].value == reward("passed", 0.5, 4.0)
    assert t.best().id == "a1"


def test_widening_limit():
    assert [widen_limit(v, 1.0, 0.5) for v in (1, 3, 4, 8, 9)] == [1, 1, 2, 2, 3]
    assert widen_limit(4, 2.0, 0.5) == 4


def test_uct_picks_by_formula_on_a_known_tree():
    # root has 3 children, visits 9 -> widening limit 3: no expansion at the root.
    t = build([(ROOT, None, "reference", 1.0),
               ("a", ROOT, "passed", 1.2), ("b", ROOT, "passed", 1.5), ("c", ROOT, "passed", 1.1),
               ("a1", "a", "passed", 1.3), ("a2", "a", "passed", 1.0), ("a3", "a", "passed", 1.05),
               ("b1", "b", "passed", 1.4), ("b2", "b", "passed", 1.6)])
    root = t.nodes[ROOT]
    assert root.visits == 9 and len(root.children) == 3
    c = 0.5
    scores = {k: uct_score(t.nodes[k], root.visits, c) for k in "abc"}
    expected = {k: t.nodes[k].value + c * math.sqrt(math.log(9) / t.nodes[k].visits) for k in "abc"}
    assert scores == expected
    best_child = max(scores, key=scores.get)
    chosen = select(t, c, 1.0, 0.5)
    # descends into the best child; that child (3 visits, 2 children, limit 1) descends again or widens
    assert chosen.id in {best_child} | set(t.nodes[best_child].children)
    assert chosen.id in t.nodes and t.lineage(chosen.id)[1].id == best_child
    # with a huge exploration constant the least visited child wins
    assert t.lineage(select(t, 100.0, 1.0, 0.5).id)[1].id == "c"


def test_failed_nodes_are_kept_but_never_expanded():
    t = build([(ROOT, None, "reference", 1.0), ("x", ROOT, "rejected", None), ("y", ROOT, "crash", None)])
    assert t.nodes["x"].dead and not t.nodes["x"].expandable
    # root: visits 3, limit 1, two (failed) children -> nothing to descend into -> widen at the root
    assert select(t, 0.5, 1.0, 0.5).id == ROOT


def test_exhausted_tree_returns_none():
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2)])
    t.nodes[ROOT].expandable = False
    t.nodes["a"].expandable = False
    assert select(t, 0.5, 1.0, 0.5) is None
    assert t.nodes[ROOT].dead


def test_pending_children_count_toward_widening():
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2), ("b", ROOT, "passed", 1.1),
               ("c", ROOT, "passed", 1.3)])
    # visits 4 -> limit 2; 3 children: descend
    assert select(t, 0.5, 1.0, 0.5).id != ROOT
    t2 = build([(ROOT, None, "reference", 1.0)])
    assert select(t2, 0.5, 1.0, 0.5).id == ROOT
    t2.nodes[ROOT].pending = 1  # one child already being evaluated, limit 1: no second expansion there
    t2.nodes[ROOT].expandable = True
    assert select(t2, 0.5, 1.0, 0.5).id == ROOT  # no child to descend to: widens anyway rather than stall
