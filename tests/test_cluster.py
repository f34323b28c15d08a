"""The Dask cluster pool on the CPU: real ``distributed.LocalCluster`` worker processes, real
evaluations of the CPU candidates, the search and its git store as the CLI runs them.

No test here measures a speed: verdicts, nodes in git, counts and reasons only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import tomllib
from pathlib import Path

import pytest
from conftest import FAST_TOML

from forge_tui.cluster import worker as remote
from forge_tui.cluster.events import ClusterStatus, WorkerChanged
from forge_tui.cluster.pool import DaskEvalPool, scheduler_address, workers_for
from forge_tui.config import parse_config
from forge_tui.errors import ForgeError
from forge_tui.search.events import EventBus, Recorder
from forge_tui.search.pool import LocalEvalPool
from forge_tui.search.proposer import ScriptedProposer
from forge_tui.search.runner import Search
from forge_tui.search.store import SearchStore
from forge_tui.workspace import Workspace

HERE = Path(__file__).parent
CPU = HERE / "candidates" / "cpu"
GOOD = (CPU / "softmax_good.cpp").read_text()
SEARCH = "\n[search]\nevals_per_card = 3\nmax_evals = 6\nparallel = 2\n[pool]\nconnect_timeout_s = 20.0\n"
CFG = parse_config(tomllib.loads(FAST_TOML + SEARCH))
VERDICT = {"passed": "correct", "noisy": "correct"}
"""A correct kernel timed on a busy machine is noisy: the same verdict, speed aside."""


def local_cluster(n: int = 2, *, allowed_failures: int = 2, **kw):
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures}):
        return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, resources={"CPU": 1},
                            dashboard_address=None, **kw)


def plan(tmp: Path, entries: list[dict], delay_s: float = 0.0) -> Path:
    path = tmp / "plan.json"
    path.write_text(json.dumps({"delay_s": delay_s, "cards": {"_softmax": entries}}))
    return path


THREE = [{"source": GOOD, "move": "good"},
         {"source": (CPU / "softmax_no_max.cpp").read_text(), "move": "no max"},
         {"source": (CPU / "syntax_error.cpp").read_text(), "move": "syntax error"}]


def nodes(ws: Workspace) -> dict[tuple[str, str], str]:
    """(card, move) -> the node's verdict, for every node but the roots."""
    with ws.git() as repo:
        recs = SearchStore(repo).load().nodes
    out: dict[tuple[str, str], str] = {}
    for r in recs:
        if r.node != "root":
            assert (r.card, r.move) not in out, f"{r.card} {r.move} is in git twice"
            out[(r.card, r.move)] = VERDICT.get(r.status, r.status)
    return out


def node_commits(ws: Workspace) -> dict[tuple[str, str], str]:
    with ws.git() as repo:
        return {(r.card, r.node): r.commit for r in SearchStore(repo).load().nodes}


def search(ws: Workspace, pool, plan_path: Path, *, cfg=CFG, bus: EventBus | None = None, resume: bool = False):
    return Search(ws, cfg, ScriptedProposer.from_file(plan_path), pool, bus=bus).run(resume=resume)


@pytest.fixture(scope="module")
def base_ws(tmp_path_factory):
    """A profiled workspace with two softmax cards (copied by each test that searches)."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("cluster")
    (root / "forge.toml").write_text(FAST_TOML)
    ws, _ = profile_into_workspace(str(HERE / "data" / "workloads" / "two_softmax.py"), root / "base", device="cpu",
                                   config_path=root / "forge.toml")
    assert len([c for c in ws.cards() if c.id.startswith("_softmax")]) == 2
    return ws


def copy_ws(base: Workspace, dest: Path) -> Workspace:
    shutil.copytree(base.root, dest)
    return Workspace.open(dest)


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes offering CPU=1; the scheduler gives an evaluation up once two workers
    died under it (the pool's [pool] retries = 2)."""
    cl = local_cluster(2)
    yield cl
    cl.close()


@pytest.fixture(scope="module")
def cluster_search(base_ws, cluster, tmp_path_factory):
    """One search over the two cards through the cluster: (workspace, summary, events, tensors
    each worker received)."""
    tmp = tmp_path_factory.mktemp("cluster-search")
    ws = copy_ws(base_ws, tmp / "ws")
    rec = Recorder()
    bus = EventBus()
    bus.subscribe(rec)
    pool = DaskEvalPool(ws.store, CFG, scheduler=cluster.scheduler_address, backend="cpu", bus=bus, poll_s=0.2)
    try:
        # the workers count what every pool sent them: a test before this one on the same cluster
        # may have sent them these tensors already
        before = pool.received()
        summary = search(ws, pool, plan(tmp, THREE), bus=bus)
        after = pool.received()
    finally:
        pool.close()
    received = {w: {k: n - before.get(w, {}).get(k, 0) for k, n in got.items() if n > before.get(w, {}).get(k, 0)}
                for w, got in after.items()}
    return ws, summary, rec.events, received


# ---- a search through the cluster -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_search_through_the_cluster_has_the_local_pools_nodes_and_verdicts(base_ws, cluster_search, tmp_path):
    """The same plan on the same cards: the same nodes (card and move) with the same verdicts, once
    each; each result names the worker that ran it (host and device)."""
    ws, summary, events, _ = cluster_search
    assert summary.evaluations == 6 and summary.pool_failure is None, summary.stopped
    local_ws = copy_ws(base_ws, tmp_path / "local")
    pool = LocalEvalPool(local_ws.store, local_ws.cache, CFG, backend="cpu")
    try:
        search(local_ws, pool, plan(tmp_path, THREE))
    finally:
        pool.close()
    here, there = nodes(local_ws), nodes(ws)
    assert there == here, (there, here)
    assert sorted(set(there.values())) == ["build_failed", "correct", "rejected"]
    with ws.git() as repo:
        store = SearchStore(repo)
        results = [json.loads(store.read(r.commit, "result.json")) for r in store.load().nodes if r.node != "root"]
    addresses = {w.address for e in events if isinstance(e, WorkerChanged) and e.change == "joined" for w in [e]}
    assert all(r["worker"]["address"] in addresses and r["worker"]["host"] == socket.gethostname()
               and r["worker"]["device"] for r in results), [r.get("worker") for r in results]
    status = [e for e in events if isinstance(e, ClusterStatus)]
    assert status and sum(w.done for w in status[-1].workers) == 6
    assert any(e.in_flight and e.in_flight[0].worker for e in status)  # evaluations shown while in flight


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cards_tensors_reach_each_worker_once(base_ws, cluster_search):
    """Each captured tensor reaches a worker once, however many of the card's evaluations it runs,
    and is checked against its hash there."""
    ws, _, events, received = cluster_search
    keys = {k for c in ws.cards() if c.id.startswith("_softmax") for s in c.samples for k in (*s.inputs, *s.outputs)}
    seen = {k for counts in received.values() for k in counts}
    assert seen == keys, (seen, keys)
    assert all(n == 1 for counts in received.values() for n in counts.values()), received
    done = [w.done for w in [e for e in events if isinstance(e, ClusterStatus)][-1].workers]
    assert max(done) >= 2  # a worker ran several evaluations, and still received each tensor once


def test_a_tensor_changed_on_the_way_is_refused(tmp_path):
    """A datum whose bytes do not hash to its key is not stored, and says why."""
    import io

    import torch

    from forge_tui.tensorstore import TensorStore

    src = TensorStore(tmp_path / "src")
    key = src.put(torch.arange(6.0))
    raw = src.path(key).read_bytes()
    dest = TensorStore(tmp_path / "dest")
    assert remote.install(dest, key, raw) is None and dest.has(key)
    other = io.BytesIO()
    torch.save({"flat": torch.arange(6.0) + 1, "shape": [6], "stride": [1], "mode": "span"}, other)
    bad = TensorStore(tmp_path / "bad")
    why = remote.install(bad, key, other.getvalue())
    assert why is not None and "bytes changed on the way" in why and not bad.has(key)


# ---- faults ---------------------------------------------------------------------------------------------
def _worker_running_an_evaluation(status_events: list, deadline_s: float = 180.0) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for e in list(status_events):
            for f in e.in_flight:
                if f.worker:
                    return f.worker
        time.sleep(0.05)
    raise AssertionError("no evaluation was seen running on a worker")


def _kill(client, address: str) -> None:
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_killed_mid_evaluation_costs_only_a_retry(base_ws, cluster, tmp_path):
    """SIGKILL to the worker running an evaluation: the scheduler runs it again on the other
    worker, the search completes, and every node is in git once."""
    from distributed import Client

    ws = copy_ws(base_ws, tmp_path / "ws")
    entries = [{"source": GOOD + f"\n// variant {i}\n", "move": f"variant {i}"} for i in range(3)]
    statuses: list = []
    bus = EventBus()
    bus.subscribe(lambda e: isinstance(e, ClusterStatus) and statuses.append(e))
    rec = Recorder()
    bus.subscribe(rec)
    pool = DaskEvalPool(ws.store, CFG, scheduler=cluster.scheduler_address, backend="cpu", bus=bus, poll_s=0.2)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(summary=search(ws, pool, plan(tmp_path, entries), bus=bus)))
    t.start()
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        victim = _worker_running_an_evaluation(statuses)
        _kill(client, victim)
        t.join(timeout=600)
    pool.close()
    assert not t.is_alive()
    summary = out["summary"]
    assert summary.evaluations == 6 and summary.pool_failure is None, summary.stopped
    got = nodes(ws)
    assert sorted(got) == sorted((c, f"variant {i}") for c in {c for c, _ in got} for i in range(3))
    assert set(got.values()) == {"correct"}, got  # the killed evaluation was run again, not failed
    assert any(isinstance(e, WorkerChanged) and e.change == "left" and e.address == victim for e in rec.events)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_only_worker_killed_mid_evaluation_gets_the_evaluation_and_its_tensors_again(base_ws, tmp_path):
    """With one worker, the only copy of the card's tensors dies with it: once the worker is back
    (its nanny restarts it) the evaluation runs there, tensors sent again, as its one retry."""
    from distributed import Client

    cl = local_cluster(1)
    try:
        ws = copy_ws(base_ws, tmp_path / "ws")
        statuses: list = []
        bus = EventBus()
        bus.subscribe(lambda e: isinstance(e, ClusterStatus) and statuses.append(e))
        pool = DaskEvalPool(ws.store, CFG, scheduler=cl.scheduler_address, backend="cpu", bus=bus, poll_s=0.2)
        try:
            card = next(c for c in ws.cards() if c.id.startswith("_softmax"))
            fut = pool.submit(card, GOOD)
            with Client(cl.scheduler_address, set_as_default=False) as client:
                victim = _worker_running_an_evaluation(statuses)
                _kill(client, victim)
            r = fut.result(timeout=300)
        finally:
            pool.close()
    finally:
        cl.close()
    assert r.correct, r.reason
    assert r.worker["address"] != victim  # the restarted worker, at a new address
    assert any(f.attempt == 2 for e in statuses for f in e.in_flight)


@pytest.fixture(scope="module")
def lone_worker(tmp_path_factory):
    """One worker process that cannot load libseccomp (its ``pyseccomp`` import fails), whose
    scheduler gives an evaluation up at the first worker death."""
    pre = tmp_path_factory.mktemp("preload") / "no_seccomp.py"
    pre.write_text("import sys\nsys.modules['pyseccomp'] = None  # import pyseccomp fails here\n")
    cl = local_cluster(1, allowed_failures=0, preload=[str(pre)])
    yield cl
    cl.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_without_confinement_refuses_candidates(base_ws, lone_worker, tmp_path):
    """The pool will not start on a cluster whose only worker cannot confine candidates, and
    says why; the worker itself refuses an evaluation sent to it, with the same reason."""
    from distributed import Client

    ws = copy_ws(base_ws, tmp_path / "ws")
    with pytest.raises(ForgeError) as err:
        DaskEvalPool(ws.store, CFG, scheduler=lone_worker.scheduler_address, backend="cpu")
    assert "cannot confine candidates: libseccomp could not be loaded" in str(err.value), err.value
    card = next(c for c in ws.cards() if c.id.startswith("_softmax"))
    with Client(lone_worker.scheduler_address, set_as_default=False) as client:
        text = client.submit(remote.evaluate, card.model_dump(mode="json"), GOOD, None,
                             json.dumps(CFG.model_dump(mode="json")), "cpu", "required", {},
                             resources={"CPU": 1}, pure=False).result(timeout=120)
    r = json.loads(text)
    assert r["status"] == "error" and r["failure"] == "worker_refused", r
    assert "cannot confine candidates: libseccomp could not be loaded" in r["reason"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_evaluation_whose_workers_keep_dying_fails_with_the_reason(base_ws, lone_worker, tmp_path):
    """Past the retries (none here), a lost worker fails the evaluation as an error naming the
    workers that died, instead of the search waiting on it."""
    from distributed import Client

    off = parse_config({**CFG.model_dump(), "evaluator": {**CFG.evaluator.model_dump(), "confinement": "off"},
                        "pool": {**CFG.pool.model_dump(), "retries": 0}})
    ws = copy_ws(base_ws, tmp_path / "ws")
    statuses: list = []
    bus = EventBus()
    bus.subscribe(lambda e: isinstance(e, ClusterStatus) and statuses.append(e))
    pool = DaskEvalPool(ws.store, off, scheduler=lone_worker.scheduler_address, backend="cpu", bus=bus, poll_s=0.2)
    try:
        card = next(c for c in ws.cards() if c.id.startswith("_softmax"))
        fut = pool.submit(card, GOOD)
        with Client(lone_worker.scheduler_address, set_as_default=False) as client:
            killed = _worker_running_an_evaluation(statuses)
            _kill(client, killed)
        r = fut.result(timeout=120)
    finally:
        runs: list = []
        real_run = pool.client.run
        pool.client.run = lambda fn, *a, **kw: runs.append((fn.__name__, kw.get("workers"))) or real_run(fn, *a, **kw)
        pool.close()
    assert r.status == "error" and r.failure == "worker_lost", r.reason
    assert "died 1 times" in r.reason and "given up" in r.reason
    # closing releases the judges of the workers alive, never the dead one's (a call to it would
    # wait out the connect timeout)
    assert all(killed not in (workers or []) for name, workers in runs if name == "release"), runs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_scheduler_closed_mid_search_stops_it_and_resume_continues(base_ws, tmp_path, capsys):
    """The scheduler goes away with evaluations in flight: the search stops with that reason (exit
    1), every finished node kept and nothing recorded for what was in flight; ``--resume`` on
    another cluster runs the rest, each node once."""
    from forge_tui.cli import main

    ws = copy_ws(base_ws, tmp_path / "ws")
    (tmp_path / "forge.toml").write_text(FAST_TOML + SEARCH.replace("max_evals = 6", "max_evals = 8")
                                         .replace("evals_per_card = 3", "evals_per_card = 4"))
    entries = [{"source": GOOD + f"\n// variant {i}\n", "move": f"variant {i}"} for i in range(4)]
    cmd = ["--config", str(tmp_path / "forge.toml"), "search", str(ws.root), "--proposer",
           f"scripted:{plan(tmp_path, entries, delay_s=0.3)}", "--backend", "cpu", "-q"]
    first = local_cluster(2)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(rc=main(cmd + ["--cluster", first.scheduler_address])))
    t.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(node_commits(ws)) < 2 + 2:  # the roots and two nodes
        time.sleep(0.1)
    first.sync(first.scheduler.close)  # the scheduler alone: its workers are left running
    t.join(timeout=300)
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        first.close()  # its scheduler is gone: closing waits on it for the connect timeout (30 s)
    assert not t.is_alive() and out["rc"] == 1
    err = capsys.readouterr().err
    assert "went away" in err and "--resume continues" in err, err
    before = node_commits(ws)
    assert 2 + 2 <= len(before) < 2 + 8
    second = local_cluster(2)
    try:
        assert main(cmd + ["--cluster", second.scheduler_address, "--resume"]) == 0
    finally:
        second.close()
    after = node_commits(ws)
    assert all(after[k] == v for k, v in before.items())  # finished nodes kept, unchanged
    got = nodes(ws)
    assert sorted(m for _, m in got) == sorted(f"variant {i}" for i in range(4) for _ in range(2)), got


def test_a_cluster_address_at_nothing_is_one_line_and_exit_2(base_ws, tmp_path, capsys):
    from forge_tui.cli import main

    ws = copy_ws(base_ws, tmp_path / "ws")
    (tmp_path / "forge.toml").write_text(FAST_TOML + "\n[pool]\nconnect_timeout_s = 1.0\n")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address, why in ((f"tcp://127.0.0.1:{port}", f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"),
                         ("nothing", "not a Dask scheduler address: 'nothing'")):
        for cmd in (["search", str(ws.root), "--cluster", address, "--proposer", "templates", "--backend", "cpu"],
                    ["retime", str(ws.root), "--cluster", address, "--backend", "cpu"]):
            rc = main(["--config", str(tmp_path / "forge.toml"), *cmd])
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith(f"forge: error: {why}") and err.count("\n") == 1, (cmd[0], err)
    assert node_commits(ws) == {}  # nothing written


# ---- rules without a cluster ------------------------------------------------------------------------
INFO = {"address": "tcp://10.0.0.5:40000", "host": "gpu-box", "resources": {"GPU": 1}, "gpus": 1,
        "gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "confinement": None, "version": "1.0",
        "cuda_visible_devices": "0"}


@pytest.mark.parametrize("change, why", [
    ({"gpus": 4, "cuda_visible_devices": None}, "it sees 4 GPUs and CUDA_VISIBLE_DEVICES does not say which"),
    ({"gpus": 0}, "sees no CUDA GPU"),
    ({"confinement": "libseccomp could not be loaded"}, "cannot confine candidates: libseccomp could not be loaded"),
    ({"version": "0.9"}, "it runs forge-tui 0.9, the search runs 1.0"),
])
def test_a_worker_that_cannot_judge_is_refused_with_the_reason(change, why):
    assert remote.refusal(INFO, "cuda", "required", "1.0") is None
    got = remote.refusal({**INFO, **change}, "cuda", "required", "1.0")
    assert got is not None and why in got, got


def test_a_worker_that_lists_its_own_gpu_first_is_used(monkeypatch):
    """dask-cuda's workers see every GPU, their own first in CUDA_VISIBLE_DEVICES: the judge gets that one."""
    assert remote.refusal({**INFO, "gpus": 4, "cuda_visible_devices": "2,3,0,1"}, "cuda", "required", "1.0") is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,0,1")
    assert remote.own_gpu() == "2"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert remote.own_gpu() is None


def test_without_required_confinement_a_worker_without_it_is_used():
    assert remote.refusal({**INFO, "confinement": "no libseccomp"}, "cuda", "off", "1.0") is None


def test_each_card_keeps_to_one_device_where_the_workers_differ():
    devices = {"tcp://a:1": "H100 (sm_90)", "tcp://b:1": "H100 (sm_90)", "tcp://c:1": "A100 (sm_80)"}
    pinned: dict[str, str] = {}
    assert workers_for("x", devices, False, pinned) == ("tcp://a:1", "tcp://b:1")
    assert pinned == {"x": "H100 (sm_90)"}
    pinned["y"] = "A100 (sm_80)"
    assert workers_for("y", devices, False, pinned) == ("tcp://c:1",)
    assert workers_for("y", {k: v for k, v in devices.items() if k != "tcp://c:1"}, False, pinned) is None
    same = {"tcp://a:1": "H100 (sm_90)", "tcp://b:1": "H100 (sm_90)"}
    assert workers_for("z", same, False, {}) is None  # one device: any worker with the resource
    assert workers_for("z", same, True, {}) == ("tcp://a:1", "tcp://b:1")  # but never a refused one


@pytest.mark.parametrize("text, want", [("tcp://gpu-box:8786", "tcp://gpu-box:8786"), ("gpu-box:8786", "tcp://gpu-box:8786"),
                                        ("tls://10.0.0.1:8786", "tls://10.0.0.1:8786")])
def test_scheduler_addresses(text, want):
    assert scheduler_address(text) == want


@pytest.mark.parametrize("text", ["", "gpu-box", "http://gpu-box:8786", "tcp://gpu-box:port"])
def test_a_bad_scheduler_address_says_what_is_expected(text):
    with pytest.raises(ForgeError, match="scheduler"):
        scheduler_address(text)


# ---- the app ---------------------------------------------------------------------------------------------
def _text(renderable) -> str:
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def test_the_app_shows_the_workers_and_the_evaluations_in_flight():
    """The pool's events reach the app: ``w`` opens the workers (host, device, state, evaluations
    done, why one was refused) and the evaluations in flight, redrawn as new status comes; worker
    changes go to the event log."""
    import asyncio

    from ui_fixtures import FixtureBackend, FixtureDescriber

    from forge_tui.cluster.events import EvalInFlight, WorkerView
    from forge_tui.ui.app import ForgeApp
    from forge_tui.ui.messages import SearchEventPosted
    from forge_tui.ui.workers import WorkersScreen, WorkersView

    def status(done: int, flight: list[EvalInFlight]) -> ClusterStatus:
        return ClusterStatus(seq=0, scheduler="tcp://sched:8786", backend="cuda", in_flight=flight, workers=[
            WorkerView(address="tcp://10.0.0.7:4001", host="gpu-a", device="NVIDIA H100 (sm_90)", state="busy", done=done),
            WorkerView(address="tcp://10.0.0.8:4001", host="gpu-b", device="NVIDIA H100 (sm_90)", state="refused",
                       reason="it sees 4 GPUs")])

    async def run() -> None:
        app = ForgeApp(Path("fixture"), backend=FixtureBackend(), describer=FixtureDescriber(), live_refresh=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.post_message(SearchEventPosted(WorkerChanged(seq=0, address="tcp://10.0.0.8:4001", host="gpu-b",
                                                             change="refused", reason="it sees 4 GPUs")))
            app.post_message(SearchEventPosted(status(3, [EvalInFlight(card="_softmax-abc", worker="tcp://10.0.0.7:4001",
                                                                       host="gpu-a", attempt=2, seconds=4.0)])))
            await pilot.pause()
            await pilot.press("w")
            await pilot.pause()
            assert isinstance(app.screen, WorkersScreen)
            shown = _text(app.screen.query_one(WorkersView).content)
            for want in ("gpu-a", "NVIDIA H100 (sm_90)", "busy", "refused: it sees 4 GPUs", "_softmax-abc"):
                assert want in shown, shown
            app.post_message(SearchEventPosted(status(4, [])))
            await pilot.pause()
            shown = _text(app.screen.query_one(WorkersView).content)
            assert "evaluations in flight (0)" in shown and "_softmax-abc" not in shown, shown
            assert any("worker tcp://10.0.0.8:4001 on gpu-b refused: it sees 4 GPUs" in line for line in app.log_lines)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, WorkersScreen)

    asyncio.run(run())


# ---- the bench ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.timeout(1800)  # a hang guard: four searches and two clusters, on a loaded 2-core machine
def test_the_cluster_bench_runs_on_cpu_workers(tmp_path):
    """bench/cluster_bench.py's smoke run: a scheduler and two worker processes started as a user
    would, the same search four ways, a worker killed in the last; the JSON says what each did."""
    import subprocess
    import sys

    env = dict(os.environ, OUT=str(tmp_path))
    run = subprocess.run([sys.executable, str(HERE.parent / "bench" / "cluster_bench.py"), "--device", "cpu", "--small",
                          "--evals", "3"], capture_output=True, text=True, env=env, timeout=1700)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "cluster_bench.json").read_text())
    runs = report["workloads"]["kb_softmax"]
    assert sorted(runs) == ["cluster-2", "killed", "local-1", "local-2"]
    for label, r in runs.items():
        assert r["evaluations"] == 3 and r["duplicates"] == 0 and r["agreement"] == 1.0, (label, r["stopped"])
    killed = runs["killed"]
    assert killed["killed"] and killed["killed"]["pid"] and killed["worker_lost"] == 0, killed["killed"]
    assert all(n["worker"] for n in runs["cluster-2"]["nodes"]) and not any(n["worker"] for n in runs["local-2"]["nodes"])
    assert "killed: worker tcp://" in run.stdout and "0 duplicated, 0 lost to dead workers" in run.stdout, run.stdout
