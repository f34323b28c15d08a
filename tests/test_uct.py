"""Selection on known trees: UCT scores, progressive widening, failed and exhausted nodes."""

import math

from forge_tui.search.tree import ROOT, CardTree, Node, pooled_speedups, reward
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


def in_flight(t, node_id):
    """What the search loop does when it starts evaluating a child of ``node_id``."""
    t.nodes[node_id].pending += 1
    t.add_virtual(node_id, +1)


def test_pending_children_count_toward_widening():
    """Children being proposed or evaluated (``pending``) fill widening slots like finished ones.
    Root with one child, k=1.5: the limit at 2 visits is 2, so the root is expanded. While that
    second child is in flight (one pending, one virtual visit: the limit at 3 visits is still 2),
    1 child + 1 pending fill the limit: the next selection goes below the root instead of asking
    for a third root child."""
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2)])
    assert select(t, 0.5, 1.5, 0.5).id == ROOT
    in_flight(t, ROOT)
    root = t.nodes[ROOT]
    assert widen_limit(root.visits + root.virtual, 1.5, 0.5) == 2 == len(root.children) + root.pending
    assert select(t, 0.5, 1.5, 0.5).id == "a"
    # with no child to descend to, a node in flight is expanded again rather than the search stall
    t2 = build([(ROOT, None, "reference", 1.0)])
    assert select(t2, 0.5, 1.0, 0.5).id == ROOT
    in_flight(t2, ROOT)  # limit 1, filled by the pending child
    assert select(t2, 0.5, 1.0, 0.5).id == ROOT


def test_parallel_selections_never_overfill_a_node():
    """Selections made while earlier ones are still in flight (as the search loop makes them with
    parallel > 1): a node is handed out for expansion only while its children plus those in flight
    stay under its widening limit, counting the virtual visits of the evaluations in flight."""
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2)])
    k, alpha = 2.0, 0.5
    picked = []
    for _ in range(6):
        node = select(t, 0.5, k, alpha)
        assert len(node.children) + node.pending < widen_limit(node.visits + node.virtual, k, alpha) or \
            not [c for c in node.children if not t.nodes[c].dead]
        picked.append(node.id)
        in_flight(t, node.id)
    root = t.nodes[ROOT]
    assert len(root.children) + root.pending <= widen_limit(root.visits + root.virtual, k, alpha)
    assert 1 < picked.count(ROOT) < 6 and "a" in picked  # the root widened, then the search went below it


def test_progressive_widening_adds_children_as_visits_grow():
    """Root with one child whose subtree holds 3 more visits (root visits 4, limit 2): the root gets
    a second child rather than the search descending again."""
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.5), ("a1", "a", "passed", 1.6),
               ("a2", "a", "passed", 1.7)])
    assert t.nodes[ROOT].visits == 4 and widen_limit(4, 1.0, 0.5) == 2
    assert select(t, 0.5, 1.0, 0.5).id == ROOT


def test_a_grown_tree_has_exactly_the_widening_limits_children():
    """40 evaluations, one at a time, all of the same reward: the root ends with widen_limit(40)
    children (not 1: it widens; not more: it descends), and no node has more children than its
    limit."""
    k, alpha = 1.0, 0.5
    t = build([(ROOT, None, "reference", 1.0)])
    for seq in range(1, 40):
        parent = select(t, 0.5, k, alpha)
        t.add(Node("c", f"n{seq}", parent.id, seq, "passed", 1.1))
    root = t.nodes[ROOT]
    assert root.visits == 40 and len(root.children) == widen_limit(40, k, alpha) == 6
    assert all(len(n.children) <= widen_limit(n.visits, k, alpha) for n in t.nodes.values())
    assert max(len(t.lineage(n)) for n in t.nodes) > 2  # and it went deep too


def test_virtual_visits_lower_the_exploration_bonus():
    """An evaluation in flight below a child counts as a visit of it in the UCT score."""
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2), ("b", ROOT, "passed", 1.2)])
    a, b, c = t.nodes["a"], t.nodes["b"], 0.5
    assert uct_score(a, 3, c) == uct_score(b, 3, c) == a.value + c * math.sqrt(math.log(3) / 1)
    t.add_virtual("a", +1)
    assert uct_score(a, 3, c) == a.value + c * math.sqrt(math.log(3) / 2) < uct_score(b, 3, c)
    t.add_virtual("a", -1)
    assert a.virtual == 0 and uct_score(a, 3, c) == uct_score(b, 3, c)


def test_selection_descends_to_the_child_with_fewer_visits_in_flight():
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2), ("b", ROOT, "passed", 1.2),
               ("a1", "a", "passed", 1.0), ("b1", "b", "passed", 1.0)])
    # root: 5 visits, limit 2, two children: descend; a and b have the same value and visits
    assert t.lineage(select(t, 0.5, 1.0, 0.5).id)[1].id == "a"  # a tie goes to the older child
    in_flight(t, "a1")
    assert t.lineage(select(t, 0.5, 1.0, 0.5).id)[1].id == "b"  # a's in-flight visit tips it to b


def test_ties_go_to_the_older_child():
    t = build([(ROOT, None, "reference", 1.0), ("b", ROOT, "passed", 1.2), ("a", ROOT, "passed", 1.2),
               ("b1", "b", "passed", 1.0), ("a1", "a", "passed", 1.0)])
    assert t.lineage(select(t, 0.5, 1.0, 0.5).id)[1].id == "b"  # b was added first (lower seq)


def test_reward_clamps_both_ways_and_noisy_is_neutral():
    assert reward("passed", 1 / 64, 4.0) == 0.0 and reward("passed", 64.0, 4.0) == 1.0
    assert reward("passed", 1.0, 4.0) == reward("reference", 1.0, 4.0) == 0.5
    assert reward("passed", 0.5, 4.0) == 0.25 and reward("passed", 2.0, 2.0) == 1.0  # log(speedup) / log(cap)
    assert reward("noisy", 3.0, 4.0) == reward("noisy", None, 4.0) == 0.5  # its speed is unknown: eager's
    for failed in ("rejected", "crash", "timeout", "build_failed", "error"):
        assert reward(failed, 3.0, 4.0) == 0.0
    assert reward("passed", 0.0, 4.0) == 0.0 and reward("passed", None, 4.0) == 0.0


def test_a_noisy_node_grows_but_is_never_best():
    t = build([(ROOT, None, "reference", 1.0), ("a", ROOT, "passed", 1.2), ("n", ROOT, "noisy", 3.0)])
    assert t.nodes["n"].expandable and not t.nodes["n"].dead
    assert t.nodes["n"].value == 0.5 and t.nodes[ROOT].value == reward("passed", 1.2, 4.0)
    assert t.best().id == "a"


def test_the_best_node_is_the_fastest_by_its_own_time_against_a_pooled_eager():
    """Each evaluation's ratio divides by its own sample of eager: "a" drew a slow eager (200 µs)
    and claims 10x at 20 µs, "b" a fast one (135 µs) and claims 9x at 15 µs. Against eager
    pooled over the card (the median, 200 µs here), "b" is the faster kernel and the best."""
    t = CardTree("c", cap=4.0)
    t.add(Node("c", ROOT, None, 0, "reference", 1.0))
    t.add(Node("c", "a", ROOT, 1, "passed", 10.0, time_us=20.0, eager_us=200.0))
    t.add(Node("c", "b", ROOT, 2, "passed", 9.0, time_us=15.0, eager_us=135.0))
    t.add(Node("c", "n", ROOT, 3, "noisy", None, time_us=1.0, eager_us=1000.0))  # not timed: neither ranked nor pooled
    assert t.best().id == "b"
    assert pooled_speedups([("a", "passed", 10.0, 20.0, 200.0), ("b", "passed", 9.0, 15.0, 135.0),
                            ("n", "noisy", None, 1.0, 1000.0)]) == {"a": 10.0, "b": 200.0 / 15.0}
    # a node recorded before nodes carried their times keeps its own ratio
    t.add(Node("c", "old", ROOT, 4, "passed", 14.0))
    assert t.best().id == "old"
    slow = CardTree("c", cap=4.0)  # slower than eager pooled: the root (eager) stays the best
    slow.add(Node("c", ROOT, None, 0, "reference", 1.0))
    slow.add(Node("c", "a", ROOT, 1, "passed", 1.05, time_us=110.0, eager_us=115.0))
    slow.add(Node("c", "b", ROOT, 2, "passed", 0.9, time_us=120.0, eager_us=100.0))
    slow.add(Node("c", "d", ROOT, 3, "passed", 0.9, time_us=116.0, eager_us=104.0))
    assert slow.best().id == ROOT  # "a" claimed 1.05x on a slow sample of eager: 104 / 110 pooled
