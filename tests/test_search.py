"""The search end to end: budget across cards, parallel evaluations with a consistent repository,
replay equal to the live log, proposer failures, resume after SIGKILL of a real process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from search_helpers import CountingProposer, FakePool, make_workspace, stable_hash, synthetic_card

from forge_tui.config import parse_config
from forge_tui.errors import ForgeError
from forge_tui.search.events import EventBus, Recorder
from forge_tui.search.replay import load_events
from forge_tui.search.runner import Search
from forge_tui.search.store import SearchStore

HERE = Path(__file__).parent


def cfg(**search):
    return parse_config({"search": {"min_gain": 0.0, **search}})


def run_search(ws, config, proposer, pool, resume=False):
    bus, rec = EventBus(), Recorder()
    bus.subscribe(rec)
    summary = Search(ws, config, proposer, pool, bus=bus).run(resume=resume)
    return summary, rec


def test_budget_goes_to_the_card_with_more_to_gain(tmp_path):
    big = synthetic_card("big", share=0.40, time_us=100.0, floor_us=10.0)     # potential 0.36
    small = synthetic_card("small", share=0.10, time_us=100.0, floor_us=10.0)  # potential 0.09
    atfloor = synthetic_card("atfloor", share=0.30, time_us=10.5, floor_us=10.0)  # 95% of floor already
    ws = make_workspace(tmp_path / "ws", [big, small, atfloor])
    pool = FakePool(speedup=lambda card, src: 1.05)
    summary, rec = run_search(ws, cfg(max_evals=20, evals_per_card=50, parallel=1), CountingProposer(), pool)
    per_card = {}
    for card_id, _ in pool.calls:
        per_card[card_id] = per_card.get(card_id, 0) + 1
    assert summary.evaluations == 20
    assert per_card.get("big", 0) > 2 * per_card.get("small", 0) > 0
    assert "atfloor" not in per_card  # stopped at its floor before any evaluation
    assert "roofline floor" in summary.finished["atfloor"]
    pool.close()


def test_card_stops_when_gain_is_small_or_budget_spent(tmp_path):
    a = synthetic_card("a", share=0.5, time_us=100.0, floor_us=10.0)
    ws = make_workspace(tmp_path / "ws", [a])
    pool = FakePool(speedup=lambda card, src: 1.2)
    summary, _ = run_search(ws, cfg(max_evals=100, evals_per_card=5, parallel=2), CountingProposer(), pool)
    assert summary.evaluations == 5 and "budget of 5 evaluations" in summary.finished["a"]
    pool.close()


def test_parallel_evaluations_keep_the_repository_consistent(tmp_path):
    cards = [synthetic_card(f"c{i}", share=0.2, time_us=100.0, floor_us=5.0) for i in range(3)]
    ws = make_workspace(tmp_path / "ws", cards)
    pool = FakePool(speedup=lambda card, src: 1.0 + (stable_hash(src) % 50) / 100, delay=(0.01, 0.05),
                    status=lambda card, src: "rejected" if stable_hash(src) % 7 == 0 else "passed")
    summary, rec = run_search(ws, cfg(max_evals=40, evals_per_card=40, parallel=6), CountingProposer(), pool)
    assert pool.max_in_flight > 1  # several evaluations were really in flight together
    assert summary.evaluations == 40
    with ws.git() as repo:
        assert "error" not in repo.git("fsck", "--strict").lower()
        loaded = SearchStore(repo).load()
        assert repo.git("status", "--porcelain") == ""  # the working tree (main) was never touched
    by_card = {}
    for r in loaded.nodes:
        by_card.setdefault(r.card, {})[r.node] = r
    for card_nodes in by_card.values():
        for r in card_nodes.values():
            assert r.parent is None or r.parent in card_nodes  # every parent exists
    assert len(loaded.nodes) == 40 + 3  # plus one root per card
    seqs = [r.seq for r in loaded.nodes] + [r.seq for r in loaded.log]
    assert len(seqs) == len(set(seqs))  # one sequence, no duplicates
    pool.close()


def test_replay_equals_the_live_event_log(tmp_path):
    cards = [synthetic_card(f"c{i}", share=0.3 - 0.1 * i, time_us=100.0, floor_us=5.0) for i in range(2)]
    ws = make_workspace(tmp_path / "ws", cards)
    pool = FakePool(speedup=lambda card, src: 1.0 + (stable_hash(src) % 80) / 100, delay=(0.0, 0.02))
    summary, rec = run_search(ws, cfg(max_evals=25, evals_per_card=20, parallel=3), CountingProposer(), pool)
    live = [e.to_json() for e in rec.persistent()]
    replayed = [e.to_json() for e in load_events(ws)]
    assert live == replayed
    kinds = {e["kind"] for e in live}
    assert {"search_started", "node_added", "best_improved", "search_stopped"} <= kinds
    transient = {e.kind for e in rec.events} - kinds
    assert transient == {"node_started", "budget_spent"}
    pool.close()


def test_proposer_failures_are_recorded_and_the_search_goes_on(tmp_path):
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    pool = FakePool()
    summary, rec = run_search(ws, cfg(max_evals=6, evals_per_card=10, parallel=1), CountingProposer(fail_every=2), pool)
    failures = [e for e in rec.events if e.kind == "proposer_failed"]
    assert failures and "LLM API unreachable" in failures[0].data["reason"]
    assert summary.evaluations == 6
    # always failing: the card stops after proposer_failures in a row, the search ends cleanly
    ws2 = make_workspace(tmp_path / "ws2", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    summary2, _ = run_search(ws2, cfg(max_evals=6, proposer_failures=3, parallel=1), CountingProposer(fail_every=1), pool)
    assert summary2.evaluations == 0 and "failed 3 times" in summary2.finished["a"]
    # the same with several proposals in flight: failing calls keep returning while others are
    # out, and the card must still stop (it once spun until the wall-time limit)
    class StaggeredFailure(CountingProposer):
        calls = 0

        def propose(self, ctx):
            StaggeredFailure.calls += 1
            time.sleep(0.02 * (StaggeredFailure.calls % 3))  # the calls never all return together
            raise RuntimeError("LLM API unreachable")

    ws3 = make_workspace(tmp_path / "ws3", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    summary3, _ = run_search(ws3, cfg(max_evals=6, proposer_failures=3, parallel=3, max_wall_s=60.0),
                             StaggeredFailure(), pool)
    assert summary3.evaluations == 0 and "failed" in summary3.finished["a"] and summary3.wall_s < 30
    pool.close()


def test_proposer_sees_lineage_failures_and_sources(tmp_path):
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    pool = FakePool(speedup=lambda card, src: 1.5, status=lambda card, src: "rejected" if "kernel 2 " in src else "passed")
    prop = CountingProposer()
    run_search(ws, cfg(max_evals=8, parallel=1), prop, pool)
    first = prop.contexts[0]
    assert first.parent.id == "root" and "def reference(" in first.parent.source
    assert "aten._softmax" in first.reference_source
    later = [c for c in prop.contexts if c.failed_siblings]
    assert later and later[0].failed_siblings[0].reason == "fake failure"
    assert later[0].failed_siblings[0].source.startswith("// kernel 2 ")
    deep = [c for c in prop.contexts if len(c.lineage) > 1]
    assert deep and deep[0].lineage[0].id == "root" and deep[0].parent.source.startswith("// kernel")
    pool.close()


def test_existing_search_needs_resume(tmp_path):
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    pool = FakePool()
    run_search(ws, cfg(max_evals=2, parallel=1), CountingProposer(), pool)
    with pytest.raises(ForgeError, match="--resume"):
        run_search(ws, cfg(max_evals=4, parallel=1), CountingProposer(), pool)
    summary, rec = run_search(ws, cfg(max_evals=4, parallel=1), CountingProposer(), pool, resume=True)
    assert summary.evaluations == 4  # the two recorded ones count toward the global budget
    started = [e for e in rec.events if e.kind == "search_started"]
    assert started[0].data["resumed"] is True
    pool.close()


def test_many_nodes_replay(tmp_path):
    """A large tree comes back from git alone (the timing of 2,000 nodes is in docs/benchmarks.md)."""
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.9, time_us=100.0, floor_us=1.0)])
    pool = FakePool(speedup=lambda card, src: 1.0 + (stable_hash(src) % 100) / 100)
    run_search(ws, cfg(max_evals=300, evals_per_card=300, parallel=4), CountingProposer(), pool)
    events = load_events(ws)
    assert sum(e.kind == "node_added" for e in events) == 301
    pool.close()


# ---- a real process, killed with SIGKILL, then resumed -------------------------------------------
def test_resume_after_sigkill(tmp_path, fast_config):
    from forge_tui.workspace import profile_into_workspace

    ws, _ = profile_into_workspace("example:kb_softmax", tmp_path / "ws", device="cpu", config_path=fast_config)
    good = (HERE / "candidates" / "cpu" / "softmax_good.cpp").read_text()
    plan = {"delay_s": 0.4, "cards": {"_softmax": [
        {"source": good + f"\n// variant {i}\n", "move": f"variant {i}"} for i in range(8)]}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    forge = str(Path(sys.executable).parent / "forge")
    cmd = [forge, "--config", str(fast_config), "search", str(ws.root), "--proposer",
           f"scripted:{tmp_path / 'plan.json'}", "--backend", "cpu", "--parallel", "1", "-q"]
    env = {**os.environ}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    heads = ws.root / ".git" / "refs" / "heads" / "search"
    deadline = time.time() + 120
    while time.time() < deadline:
        # finished nodes only: a ref being written is n0NNN.lock until it is renamed into place
        n = len([p for p in heads.rglob("n0*") if not p.name.endswith(".lock")]) if heads.exists() else 0
        if n >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the search and its evaluator worker, mid-flight
    proc.wait()
    with ws.git() as repo:
        before = {(r.card, r.node): r.commit for r in SearchStore(repo).load().nodes}
        assert "error" not in repo.git("fsck", "--strict").lower()
    assert 3 <= len([k for k in before if k[1] != "root"]) < 8
    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    with ws.git() as repo:
        after = {(r.card, r.node): r.commit for r in SearchStore(repo).load().nodes}
        assert "error" not in repo.git("fsck", "--strict").lower()
    assert all(after[k] == v for k, v in before.items())  # every finished node kept, unchanged
    moves = [e.data["move"] for e in load_events(ws) if e.kind == "node_added" and e.node != "root"]
    assert sorted(moves) == sorted(f"variant {i}" for i in range(8))  # and the search went on to the end


def test_a_noisy_result_is_expanded_but_never_best(tmp_path):
    """A correct candidate timed on a busy machine ("noisy") claims no speedup: the tree may grow
    from it, it never becomes the card's best, and no best_improved event names it."""
    a = synthetic_card("a", share=0.5, time_us=100.0, floor_us=10.0)
    ws = make_workspace(tmp_path / "ws", [a])
    # the first two proposals come back noisy; the rest pass at 1.1x
    pool = FakePool(speedup=lambda card, src: 1.1,
                    status=lambda card, src: "noisy" if src.startswith(("// kernel 1 ", "// kernel 2 ")) else "passed")
    summary, rec = run_search(ws, cfg(max_evals=6, evals_per_card=6, parallel=1), CountingProposer(), pool)
    pool.close()
    added = {e.node: e.data for e in rec.events if e.kind == "node_added"}
    noisy = {n for n, d in added.items() if d["status"] == "noisy"}
    assert len(noisy) == 2 and all(added[n]["speedup"] is None for n in noisy)
    assert any(d.get("parent") in noisy for d in added.values())  # grown from a noisy node
    bests = [e.node for e in rec.events if e.kind == "best_improved"]
    assert bests and not set(bests) & noisy and summary.best["a"]["node"] not in noisy


def test_a_git_failure_stops_the_search_with_every_finished_node_kept(tmp_path, monkeypatch):
    """The object store fails (a full disk, say) after a few nodes: the search stops with a clear
    reason instead of a traceback, and what it recorded before replays."""
    from gitdb.db import LooseObjectDB

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=5.0)])
    real = LooseObjectDB.store
    calls = {"n": 0}

    def store(self, istream):
        calls["n"] += 1
        if calls["n"] > 30:
            raise OSError(28, "No space left on device")
        return real(self, istream)

    monkeypatch.setattr(LooseObjectDB, "store", store)
    pool = FakePool()
    summary, rec = run_search(ws, cfg(max_evals=50, evals_per_card=50, parallel=1), CountingProposer(), pool)
    pool.close()
    assert summary.git_failure and "No space left on device" in summary.git_failure
    assert summary.stopped.startswith("git failed") and 0 < summary.evaluations < 50
    monkeypatch.setattr(LooseObjectDB, "store", real)
    kept = [e for e in load_events(ws) if e.kind == "node_added" and e.node != "root"]
    assert len(kept) == summary.evaluations


# ---- the budget across cards, on known numbers ---------------------------------------------------
def test_a_cards_potential_is_its_share_times_what_is_left_above_the_floor():
    from forge_tui.search.budget import CardBudget

    b = CardBudget(synthetic_card("a", share=0.4, time_us=100.0, floor_us=10.0))
    assert b.potential == pytest.approx(0.4 * (1 - 10 / 100))
    b.best_speedup = 5.0  # best time 20 µs: half of what is left is gone
    assert b.best_time_us == pytest.approx(20.0) and b.potential == pytest.approx(0.4 * (1 - 10 / 20))
    assert b.stop_reason(cfg(floor_fraction=0.9).search) is None
    b.best_speedup = 10.0
    assert b.potential == pytest.approx(0.0)
    assert "reached 100% of the roofline floor" in b.stop_reason(cfg(floor_fraction=0.9).search)
    # at the floor itself the card stops even when floor_fraction asks for all of it
    assert "reached 100% of the roofline floor" in b.stop_reason(cfg(floor_fraction=1.0).search)


def test_a_floor_eager_already_beats_stops_nothing():
    """A CPU card whose data sits in cache runs under its DRAM floor: the floor is not trusted,
    its whole share is potential and it does not stop at the floor."""
    from forge_tui.search.budget import CardBudget

    b = CardBudget(synthetic_card("a", share=0.3, time_us=5.0, floor_us=10.0))
    assert not b.floor_trusted and b.floor_fraction == 0.0 and b.potential == pytest.approx(0.3)
    assert b.stop_reason(cfg(floor_fraction=0.9).search) is None


def test_the_next_evaluation_goes_to_the_highest_potential_per_evaluation_in_flight_or_spent():
    from forge_tui.search.budget import CardBudget, pick

    a = CardBudget(synthetic_card("a", share=0.4, time_us=100.0, floor_us=10.0))  # potential 0.36
    b = CardBudget(synthetic_card("b", share=0.2, time_us=100.0, floor_us=10.0))  # potential 0.18
    assert pick([a, b]) is a and pick([b, a]) is a  # not the list order
    a.evals = 1  # 0.36 / 2 == 0.18 / 1: a tie goes to the larger share
    assert a.priority == pytest.approx(b.priority) and pick([b, a]) is a
    a.in_flight = 1  # 0.36 / 3 < 0.18: evaluations in flight count as spent
    assert pick([a, b]) is b
    b.finished = "done"
    assert pick([a, b]) is a  # a finished card gets nothing
    a.finished = "done"
    assert pick([a, b]) is None


def test_a_card_stops_at_its_floor_once_a_child_gets_close(tmp_path):
    """One evaluation at 9.5x on a card 10x above its floor leaves it at 95% of the floor (over
    floor_fraction 0.9): the card stops after that one evaluation, with the reason."""
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=10.0)])
    pool = FakePool(speedup=lambda card, src: 9.5)
    summary, _ = run_search(ws, cfg(max_evals=10, evals_per_card=10, parallel=1, floor_fraction=0.9),
                            CountingProposer(), pool)
    pool.close()
    assert summary.evaluations == 1 and "reached 95% of the roofline floor" in summary.finished["a"]
    assert summary.best["a"]["speedup"] == 9.5


def test_fake_results_do_not_depend_on_the_hash_seed():
    """The fake pool's speedups come from a stable hash of the source: the same in every process,
    whatever PYTHONHASHSEED is (a search test must replay the same way every run)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from search_helpers import stable_hash; "
            "print([stable_hash(f'// kernel {i} for a from root') % 100 for i in range(20)])")
    outs = {subprocess.run([sys.executable, "-c", code, str(HERE)], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("0", "1", "12345")}
    assert len(outs) == 1


def test_the_trees_in_flight_bookkeeping_matches_the_evaluations_in_flight(tmp_path, monkeypatch):
    """Every selection sees, on every node, ``pending`` == the children being proposed or evaluated
    under it right now and ``virtual`` == the evaluations in flight in its subtree (as the events
    the loop publishes count them), and both are back to 0 at the end. With parallel 3 the loop
    selects while evaluations are in flight, so progressive widening and UCT see them."""
    import forge_tui.search.runner as runner_mod
    from forge_tui.search.uct import select as real_select

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
    started: dict[str, int] = {}
    finished: dict[str, int] = {}
    trees = []
    checked = {"selections": 0, "with_in_flight": 0}

    def on_event(e):
        if e.kind == "node_started":
            started[e.node] = started.get(e.node, 0) + 1
        elif e.kind == "node_added" and e.node != "root":
            finished[e.parent] = finished.get(e.parent, 0) + 1
        elif e.kind == "proposer_failed":
            finished[e.node] = finished.get(e.node, 0) + 1

    def checking_select(tree, c, k, alpha):
        trees.append(tree)
        in_flight = {n: started.get(n, 0) - finished.get(n, 0) for n in tree.nodes}
        for node in tree.nodes.values():
            assert node.pending == in_flight[node.id], (node.id, node.pending, in_flight)
            below = sum(in_flight[m.id] for m in tree.nodes.values() if node.id in {x.id for x in tree.lineage(m.id)})
            assert node.virtual == below, (node.id, node.virtual, below)
        checked["selections"] += 1
        checked["with_in_flight"] += any(in_flight.values())
        return real_select(tree, c, k, alpha)

    monkeypatch.setattr(runner_mod, "select", checking_select)
    bus = EventBus()
    bus.subscribe(on_event)
    pool = FakePool(speedup=lambda card, src: 1.0 + (stable_hash(src) % 50) / 100, delay=(0.0, 0.01))
    summary = Search(ws, cfg(max_evals=24, evals_per_card=24, parallel=3), CountingProposer(fail_every=5), pool,
                     bus=bus).run()
    pool.close()
    assert summary.evaluations == 24
    assert checked["selections"] >= 24 and checked["with_in_flight"] >= 10
    assert all(n.pending == 0 and n.virtual == 0 for n in trees[-1].nodes.values())


def test_only_a_passed_result_earns_its_speedup(tmp_path):
    """A result that is not 'passed' gets no speedup in the tree, whatever its result carries (a
    noisy or rejected result from another pool or an older schema claiming 9.5x): no reward, not
    best, and the card does not stop at its floor on it."""
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=10.0)])
    pool = FakePool(speedup=lambda card, src: 9.5 if src.startswith(("// kernel 1 ", "// kernel 2 ")) else 1.1,
                    status=lambda card, src: {"// kernel 1 ": "noisy", "// kernel 2 ": "rejected"}.get(src[:12], "passed"),
                    speedup_when=("passed", "noisy", "rejected"))
    summary, rec = run_search(ws, cfg(max_evals=4, evals_per_card=4, parallel=1, floor_fraction=0.9),
                              CountingProposer(), pool)
    pool.close()
    added = {e.node: e for e in rec.events if e.kind == "node_added" and e.node != "root"}
    by_status = {e.status: e for e in added.values()}
    assert set(by_status) == {"noisy", "rejected", "passed"}
    assert by_status["noisy"].speedup is None and by_status["rejected"].speedup is None
    assert summary.evaluations == 4 and "floor" not in summary.finished.get("a", "")
    assert summary.best["a"]["speedup"] == 1.1


def test_an_empty_approvals_queue_says_why_for_each_searched_card(tmp_path, capsys):
    """A card whose kernels were all timed on a busy machine, one whose fastest correct kernel is
    slower than eager, one whose kernels all failed, and one with a request: forge approve --list
    (and the approvals screen, through ``unrequested``) names a reason for each card not offered."""
    from forge_tui.cli import main
    from forge_tui.promotion import requests, unrequested

    cards = [synthetic_card(c, share=0.2, time_us=100.0, floor_us=10.0) for c in ("busy", "slow", "broken", "fast")]
    ws = make_workspace(tmp_path / "ws", cards)
    pool = FakePool(speedup=lambda card, src: {"slow": 0.8, "fast": 1.3}.get(card.id, 1.1),
                    status=lambda card, src: {"busy": "noisy", "broken": "build_failed"}.get(card.id, "passed"))
    run_search(ws, cfg(max_evals=8, evals_per_card=2, parallel=1), CountingProposer(), pool)
    pool.close()
    assert [r.card.id for r in requests(ws)] == ["fast"]
    why = dict(unrequested(ws))
    assert set(why) == {"busy", "slow", "broken"}, why
    assert "too busy to trust its timing" in why["busy"] and "(and 1 more)" in why["busy"]
    assert "ran 0.80x eager" in why["slow"] and "nothing faster than eager" in why["slow"]
    assert why["broken"] == "none of its 2 kernels passed (build_failed 2)"
    assert main(["approve", str(ws.root), "--list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("fast: ") and "not offered busy: " in out and "not offered slow: " in out
    # a rejection offers the card's next kernel; once both are rejected, the card says so
    assert main(["reject", str(ws.root), "fast"]) == 0
    assert "fast" not in dict(unrequested(ws)) and [r.node for r in requests(ws)] == ["n0002"]
    assert main(["reject", str(ws.root), "fast"]) == 0
    assert dict(unrequested(ws))["fast"] == "every kernel offered was rejected (2)"


def test_retime_times_the_noisy_kernels_again_as_their_children(tmp_path, capsys):
    """Kernels timed on a busy machine are evaluated again, each as a child of its node with its
    own source; once one passes faster than eager it is offered; a noisy node whose retimed child
    passed is not timed again; the retimes are in the recorded history."""
    from forge_tui.promotion import requests, unrequested

    busy, fast = (synthetic_card(c, share=0.3, time_us=100.0, floor_us=10.0) for c in ("busy", "fast"))
    ws = make_workspace(tmp_path / "ws", [busy, fast])
    pool = FakePool(speedup=lambda card, src: 1.3, status=lambda card, src: "noisy" if card.id == "busy" else "passed")
    run_search(ws, cfg(max_evals=4, evals_per_card=2, parallel=1), CountingProposer(), pool)
    pool.close()
    assert "busy" in dict(unrequested(ws)) and "forge retime" in dict(unrequested(ws))["busy"]
    # the machine is quiet now: the first noisy kernel passes at 1.5x, the second at 0.9x
    speeds = iter([1.5, 0.9])  # retimed in the order the kernels were recorded
    quiet = FakePool(speedup=lambda card, src: next(speeds))
    search = Search(ws, cfg(), CountingProposer(), quiet)
    summary = search.retime()
    noisy = [n for n in search.trees["busy"].nodes.values() if n.status == "noisy"]
    assert summary.evaluations == 2 and [(c, p) for c, p, _ in search.retimed] == [("busy", "n0001"), ("busy", "n0002")]
    kids = {p: n for _, p, n in search.retimed}
    assert all(n.parent == p and n.move == f"retime {p}" and n.status == "passed" for p, n in kids.items())
    assert [src for _, src in quiet.calls] == [search.sources[("busy", p)] for p in ("n0001", "n0002")]
    assert {n.id for n in noisy} == {"n0001", "n0002"}
    assert kids["n0001"].speedup == 1.5 and kids["n0002"].speedup == 0.9
    assert [(r.card.id, r.node) for r in requests(ws) if r.card.id == "busy"] == [("busy", kids["n0001"].id)]
    assert "busy" not in dict(unrequested(ws))
    # done: a second retime has nothing left to time
    again = Search(ws, cfg(), CountingProposer(), quiet).retime()
    assert again.evaluations == 0 and len(quiet.calls) == 2
    quiet.close()
    added = [e for e in load_events(ws) if e.kind == "node_added" and e.data.get("move", "").startswith("retime ")]
    assert sorted(e.data["parent"] for e in added) == ["n0001", "n0002"]


def test_forge_retime_evaluates_the_noisy_kernels_on_the_real_pool(tmp_path, capsys):
    """The command on the CPU evaluator: each noisy kernel (here a source the static checks refuse) is
    evaluated again and its child's verdict printed; with nothing noisy left, it says so."""
    from forge_tui.cli import main

    busy = synthetic_card("busy", share=0.3, time_us=100.0, floor_us=10.0)
    ws = make_workspace(tmp_path / "ws", [busy])
    pool = FakePool(status=lambda card, src: "noisy")
    run_search(ws, cfg(max_evals=1, evals_per_card=1, parallel=1), CountingProposer(), pool)
    pool.close()
    assert main(["retime", str(ws.root), "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "retimed busy n0001: n0002 rejected (static check" in out, out
    # the rejection is a verdict: the kernel is not timed again
    assert main(["retime", str(ws.root), "busy", "--backend", "cpu"]) == 0
    assert "no kernel to time again" in capsys.readouterr().out
    assert main(["retime", str(ws.root), "other", "--backend", "cpu"]) == 0
    assert "no kernel to time again" in capsys.readouterr().out


def test_retime_times_each_kernel_once_a_call_while_the_machine_stays_busy(tmp_path):
    """Two kernels timed on a busy machine, and a machine that stays busy: each retime call times
    each kernel once (2, 2, 2 evaluations, never 2, 4, 8 for the earlier retimes too), each retime a
    child of the kernel's own node; once a retime gives a kernel a verdict, it is not timed again."""
    busy = synthetic_card("busy", share=0.3, time_us=100.0, floor_us=10.0)
    ws = make_workspace(tmp_path / "ws", [busy])
    pool = FakePool(status=lambda card, src: "noisy")
    run_search(ws, cfg(max_evals=2, evals_per_card=2, parallel=1), CountingProposer(), pool)
    counts = []
    for _ in range(3):
        search = Search(ws, cfg(), CountingProposer(), pool)
        counts.append(search.retime().evaluations)
        assert sorted(p for _, p, _ in search.retimed) == ["n0001", "n0002"]
        assert all(n.parent == p and n.move == f"retime {p}" for _, p, n in search.retimed)
    assert counts == [2, 2, 2]
    verdicts = iter(["rejected", "noisy"])  # n0001 gets a verdict, n0002 stays untimed
    judged = FakePool(status=lambda card, src: next(verdicts))
    assert Search(ws, cfg(), CountingProposer(), judged).retime().evaluations == 2
    last = FakePool(status=lambda card, src: "noisy")
    search = Search(ws, cfg(), CountingProposer(), last)
    assert search.retime().evaluations == 1 and [p for _, p, _ in search.retimed] == ["n0002"]
    for p in (pool, judged, last):
        p.close()


def test_the_best_and_its_promotion_request_are_the_fastest_kernel_by_its_own_time(tmp_path):
    """Three kernels whose ratios against their own samples of eager disagree with their times:
    the card's best and the kernel offered for promotion are the fastest against eager pooled over
    the card (kernel 2 at 15 µs, not kernel 1's 10x at 20 µs on a slow sample of eager), and every
    node's times replay from its commit."""
    from forge_tui.promotion import requests

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
    plan = {1: (10.0, 20.0, 200.0), 2: (9.0, 15.0, 135.0), 3: (8.0, 22.0, 176.0)}  # ratio, µs, eager µs

    def kernel(src: str) -> int:
        return int(src.split()[2])  # "// kernel <n> for ..."

    pool = FakePool(speedup=lambda card, src: plan[kernel(src)][0], times=lambda card, src: plan[kernel(src)][1:])
    summary, rec = run_search(ws, cfg(max_evals=3, evals_per_card=3, parallel=1), CountingProposer(), pool)
    pool.close()
    with ws.git() as repo:
        recs = {r.move: r for r in SearchStore(repo).load().nodes if r.node != "root"}
    bests = [(e.node, round(e.speedup, 3)) for e in rec.events if e.kind == "best_improved"]
    assert bests == [(recs["k1"].node, 10.0), (recs["k2"].node, round(200.0 / 15.0, 3))]  # k2 against eager pooled then
    assert sorted(recs) == ["k1", "k2", "k3"]
    assert (recs["k2"].time_us, recs["k2"].eager_us, recs["k2"].speedup) == (15.0, 135.0, 9.0)
    assert summary.best["a"]["node"] == recs["k2"].node
    (req,) = requests(ws)
    assert req.node == recs["k2"].node


def test_no_promotion_request_for_a_kernel_that_beat_only_its_own_sample_of_eager(tmp_path):
    """A kernel whose paired ratio beat eager (1.5x: on a loaded machine eager and the kernel slow
    down together, sample by sample) while eager's median, pooled over the card, is 34 µs against
    its 200: the card gets no best, and no promotion is requested for it (the app's banner counted
    such a request while its tree showed the kernel at 0.17x and no star)."""
    from forge_tui.promotion import requests, unrequested

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
    plan = {1: (1.5, 200.0, 30.0), 2: (0.17, 200.0, 34.0)}  # paired ratio, µs, eager µs

    def kernel(src: str) -> int:
        return int(src.split()[2])

    pool = FakePool(speedup=lambda card, src: plan[kernel(src)][0], times=lambda card, src: plan[kernel(src)][1:])
    summary, rec = run_search(ws, cfg(max_evals=2, evals_per_card=2, parallel=1), CountingProposer(), pool)
    pool.close()
    assert [e for e in rec.events if e.kind == "best_improved"] == []
    assert requests(ws) == []
    assert len(requests(ws, faster_only=False)) == 1  # a caller with its own rule still sees it
    (why,) = unrequested(ws)  # and the empty queue says why, in the same numbers
    assert why[0] == "a" and "ran 0.17x eager: nothing faster than eager to offer" in why[1], why


def test_a_kernel_slower_than_the_eager_timed_beside_it_is_not_the_best(tmp_path):
    """The other way round: kernel 2 at 80 µs beats eager's median over the card (200 µs, 2.5x)
    but lost to the eager timed beside it (0.95x); kernel 1 beat both (2.0x). The card's best, its
    star and its promotion request are kernel 1; alone, kernel 2 is offered nowhere, and the empty
    queue gives both numbers."""
    from forge_tui.promotion import requests, unrequested

    def searched(name: str, plan: dict):
        ws = make_workspace(tmp_path / name, [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
        pool = FakePool(speedup=lambda card, src: plan[int(src.split()[2])][0],
                        times=lambda card, src: plan[int(src.split()[2])][1:])
        summary, rec = run_search(ws, cfg(max_evals=len(plan), evals_per_card=len(plan), parallel=1),
                                  CountingProposer(), pool)
        pool.close()
        with ws.git() as repo:
            nodes = {r.move: r.node for r in SearchStore(repo).load().nodes if r.node != "root"}
        return ws, summary, rec, nodes

    ws, summary, rec, nodes = searched("both", {1: (2.0, 100.0, 200.0), 2: (0.95, 80.0, 76.0)})
    assert [(e.node, e.speedup) for e in rec.events if e.kind == "best_improved"] == [(nodes["k1"], 2.0)]
    assert summary.best["a"]["node"] == nodes["k1"]
    assert [r.node for r in requests(ws)] == [nodes["k1"]]
    ws, summary, rec, nodes = searched("alone", {1: (0.95, 80.0, 100.0)})
    assert summary.best["a"]["node"] == "root" and requests(ws) == []
    assert not [e for e in rec.events if e.kind == "best_improved"]
    (why,) = unrequested(ws)
    assert "ran 1.25x eager against eager's median over the card, 0.95x against eager timed beside it" in why[1], why


def test_a_best_that_stops_beating_eager_loses_its_star(tmp_path):
    """Kernel 1 beats eager (1.2x, 90 µs against 108); kernels 2 and 3 lose (0.5x) beside an
    eager of 30 µs, which brings eager's median over the card to 30 µs: kernel 1 now runs 0.33x of
    it and nothing on the card beats eager. A BestLost event says so, the app's state drops the card's
    star, the queue offers nothing, and a replay yields the same events."""
    from forge_tui.promotion import requests
    from forge_tui.ui.state import SearchState

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
    plan = {1: (1.2, 90.0, 108.0), 2: (0.5, 60.0, 30.0), 3: (0.5, 60.0, 30.0)}  # paired ratio, µs, eager µs
    pool = FakePool(speedup=lambda card, src: plan[int(src.split()[2])][0],
                    times=lambda card, src: plan[int(src.split()[2])][1:])
    summary, rec = run_search(ws, cfg(max_evals=3, evals_per_card=3, parallel=1), CountingProposer(), pool)
    pool.close()
    with ws.git() as repo:
        nodes = {r.move: r.node for r in SearchStore(repo).load().nodes if r.node != "root"}
    kinds = [(e.kind, e.node) for e in rec.events if e.kind in ("best_improved", "best_lost")]
    assert kinds == [("best_improved", nodes["k1"]), ("best_lost", nodes["k1"])]
    (lost,) = [e for e in rec.events if e.kind == "best_lost"]
    assert round(lost.speedup, 3) == round(30.0 / 90.0, 3) and lost.previous == 1.2 and lost.seq > 0
    assert "nothing on this card beats eager" in lost.line()
    state = SearchState()
    for e in rec.events:
        state.apply(e)
    assert state.best() == {} and state.progress[-1][2] == 1.0
    assert summary.best["a"]["node"] == "root" and requests(ws) == []
    replayed = [e for e in load_events(ws) if e.persistent]
    assert [(e.kind, e.node) for e in replayed if e.kind in ("best_improved", "best_lost")] == kinds


def test_one_ratio_against_a_slow_sample_of_eager_does_not_finish_a_card_at_its_floor(tmp_path):
    """A kernel's paired ratio of 50x (eager's sample ran slow beside it) while its time against
    eager's median says 1.5x: the card (100 µs, floor 10) is not finished as at its floor after
    that evaluation; the search goes on with the speed its best can claim."""
    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=10.0)])
    pool = FakePool(speedup=lambda card, src: 50.0 if " 1 " in src else 1.2,
                    times=lambda card, src: (60.0, 90.0) if " 1 " in src else (80.0, 90.0))
    summary, _ = run_search(ws, cfg(max_evals=3, evals_per_card=3, parallel=1), CountingProposer(), pool)
    pool.close()
    assert summary.evaluations == 3, summary
    assert "roofline floor" not in (summary.finished.get("a") or ""), summary.finished


def test_the_apps_node_lines_show_the_speedup_the_card_is_ranked_by(tmp_path):
    """The search tree's node lines and its card line speak of one number: each passed kernel's
    speedup against eager pooled over the card, as the search ranks them (not the paired ratio
    against its own sample of eager), with the kernel's own time; the cost plot's points too. A
    node recorded without its times keeps its ratio."""
    from forge_tui.ui.state import SearchState, points
    from forge_tui.ui.widgets.search.tree import card_label, node_label

    ws = make_workspace(tmp_path / "ws", [synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)])
    plan = {1: (10.0, 20.0, 200.0), 2: (9.0, 15.0, 135.0), 3: (8.0, None, None)}  # ratio, µs, eager µs

    def kernel(src: str) -> int:
        return int(src.split()[2])

    pool = FakePool(speedup=lambda card, src: plan[kernel(src)][0],
                    times=lambda card, src: None if plan[kernel(src)][1] is None else plan[kernel(src)][1:])
    _, rec = run_search(ws, cfg(max_evals=3, evals_per_card=3, parallel=1), CountingProposer(), pool)
    pool.close()
    state = SearchState.of(rec.events)
    card = state.cards["a"]
    by_move = {n.move.split()[-1]: n for n in card.nodes.values() if n.id != "root"}
    k1, k2, k3 = by_move["k1"], by_move["k2"], by_move["k3"]
    assert (k2.time_us, k2.eager_us, k3.time_us) == (15.0, 135.0, None)
    pooled = 200.0  # the median of the timed evaluations' eager (135, 200)
    assert card.ranked() == pytest.approx({k1.id: pooled / 20.0, k2.id: pooled / 15.0, k3.id: 8.0})
    assert card.best == k2.id and card.best_speedup == pytest.approx(pooled / 15.0)
    assert f"best {pooled / 15.0:.2f}x" in str(card_label(card))
    line = str(node_label(k2, True, card.ranked()[k2.id]))
    assert f"{pooled / 15.0:.2f}x 15.0 µs" in line and "9.00x" not in line
    assert f"{pooled / 20.0:.2f}x 20.0 µs" in str(node_label(k1, False, card.ranked()[k1.id]))
    assert "8.00x" in str(node_label(k3, False, card.ranked()[k3.id]))
    assert sorted(sp for _, _, sp in points(state)) == pytest.approx(sorted(card.ranked().values()))


def test_an_op_card_is_never_skipped_because_of_a_module_card_the_search_leaves_out(tmp_path):
    """An op card nested in a module card is not searched apart; it says so only where the module
    card is searched. Where the module card is not among the top cards, the op card says that
    instead of "(that card is searched)"."""
    big = [synthetic_card(f"big{i}", share=0.2, time_us=100.0, floor_us=1.0) for i in range(2)]
    norm = synthetic_card("mod-norm", share=0.01, time_us=100.0, floor_us=1.0)
    norm.kind, norm.target = "module", "module:Norm"
    inner = synthetic_card("rsqrt", share=0.005, time_us=50.0, floor_us=1.0)
    inner.within = ["mod-norm"]
    ws = make_workspace(tmp_path / "ws", [*big, norm, inner])
    pool = FakePool()
    summary, _ = run_search(ws, cfg(max_evals=2, evals_per_card=1, parallel=1, top=2), CountingProposer(), pool)
    assert summary.skipped["mod-norm"] == "not among the top 2 cards by potential gain"
    assert summary.skipped["rsqrt"] == ("it runs inside mod-norm, which is not searched either (not among the top 2 "
                                        "cards by potential gain)")
    summary, _ = run_search(ws, cfg(max_evals=4, evals_per_card=1, parallel=1, top=3), CountingProposer(), pool,
                            resume=True)
    assert "mod-norm" not in summary.skipped
    assert summary.skipped["rsqrt"] == "it runs inside mod-norm, whose kernel serves it (that card is searched)"
    pool.close()


def test_a_resumed_search_with_a_larger_budget_searches_the_cards_whose_budget_was_spent(tmp_path):
    """A card that finished because its own evaluation budget was spent is searched again by a
    resumed search whose budget per card is larger (the app's g after a search ran its course)."""
    card = synthetic_card("a", share=0.5, time_us=100.0, floor_us=1.0)
    ws = make_workspace(tmp_path / "ws", [card])
    pool = FakePool(speedup=lambda card, src: 1.05)
    summary, _ = run_search(ws, cfg(max_evals=10, evals_per_card=2, parallel=1), CountingProposer(), pool)
    assert summary.evaluations == 2 and summary.finished["a"].startswith("its budget of 2")
    summary, _ = run_search(ws, cfg(max_evals=10, evals_per_card=2, parallel=1), CountingProposer(), pool, resume=True)
    assert summary.evaluations == 2  # the same budget: nothing more
    summary, _ = run_search(ws, cfg(max_evals=10, evals_per_card=4, parallel=1), CountingProposer(), pool, resume=True)
    assert summary.evaluations == 4
    pool.close()


def test_the_search_ranks_an_untrusted_card_by_its_bytes_and_flops(tmp_path):
    """A card timed on a busy machine at 20 ms a call (90% of the forward) does not take the
    search's only slot from a card the profile could trust: it competes with the share its bytes
    and FLOPs give it."""
    norm = synthetic_card("norm", share=0.2, time_us=200.0, floor_us=1.0)
    add = synthetic_card("add", share=0.01, time_us=10.0, floor_us=0.05)
    triu = synthetic_card("triu", share=0.9, time_us=20000.0, floor_us=0.02)
    triu.flags = ["noisy_timing"]
    ws = make_workspace(tmp_path / "ws", [norm, add, triu])
    pool = FakePool()
    summary, _ = run_search(ws, cfg(max_evals=1, evals_per_card=1, parallel=1, top=1), CountingProposer(), pool)
    pool.close()
    assert summary.skipped["triu"] == "not among the top 1 cards by potential gain"
    assert "norm" not in summary.skipped


def test_a_long_noisy_reason_is_cut_at_a_word_and_outside_its_parentheses(tmp_path):
    """The record keeps 300 characters of a node's reason: the approvals list cuts it at a word,
    before any parenthesis it would leave open (it once read "... ran 148.0x slower than its ):")."""
    from forge_tui.promotion import unrequested
    from forge_tui.search.events import shorten

    long = "correct, but the machine was too busy to trust the timing: " + "; ".join(
        f"the calibration workload ran {i}.5x slower than its best ({i}00.0 µs against 106.2 µs)" for i in range(2, 9))

    class LongReasons(FakePool):
        def _run(self, card, source):
            return super()._run(card, source).model_copy(update={"reason": long})

    ws = make_workspace(tmp_path / "ws", [synthetic_card("busy", share=0.3, time_us=100.0, floor_us=10.0)])
    pool = LongReasons(status=lambda card, src: "noisy")
    run_search(ws, cfg(max_evals=1, evals_per_card=1, parallel=1), CountingProposer(), pool)
    pool.close()
    why = dict(unrequested(ws))["busy"]
    inner = why.split("trust its timing (", 1)[1].rsplit("): forge retime", 1)[0]
    assert inner.endswith(" …") and inner.count("(") == inner.count(")") and len(inner) <= 200
    assert shorten("a (b c d e f", 8) == "a …" and shorten("short", 8) == "short"
