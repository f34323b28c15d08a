"""Evaluations per minute with the Dask cluster pool, on one host with N GPUs (or N CPU workers).

    python bench/cluster_bench.py [--device cuda|cpu] [--workers N] [--evals E] [--out DIR] [--small]
                                  [--workloads WORKLOAD ...]

Each workload (cuda: the bundled ``decoder`` and ``diffusion``; cpu: ``tiny_decoder`` and
``tiny_diffusion``; ``--small``: ``kb_softmax`` alone) is profiled once, then the same search (the
built-in template proposer, E evaluations) runs on a fresh copy of the workspace four ways:

  local-1     the local pool with one judge (one GPU; on cpu one judge)
  local-N     the local pool with N judges (CUDA_VISIBLE_DEVICES per judge on cuda)
  cluster-N   the cluster pool on a Dask scheduler and N worker processes started here, one per GPU
              (``dask worker --resources GPU=1``, CUDA_VISIBLE_DEVICES per worker; on cpu
              ``--resources CPU=1``, each worker on a core of its own and ``[timing] threads = 1``)
  killed      cluster-N again, with one worker SIGKILLed while it runs an evaluation: the search
              finishes, and every node is in git once

and prints evaluations per minute (over the search's wall time: the cluster's start is not counted),
how far the verdicts agree with local-1's (by candidate source: noisy counts as correct), and the
best speedup per card. Writes cluster_bench.json to $OUT (or --out, else bench-out/).

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1) in every process started here; nothing here needs NCCL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WORKLOADS = {"cuda": ["example:decoder", "example:diffusion"], "cpu": ["example:tiny_decoder", "example:tiny_diffusion"]}
VERDICT = {"passed": "correct", "noisy": "correct"}


def _child(core: int | None = None):
    """What each process started here runs before it starts: it dies with this script (a bench
    killed or timed out leaves no scheduler or worker behind) and, on cpu, keeps to one core."""
    def setup() -> None:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if core is not None:
            os.sched_setaffinity(0, {core})

    return setup


class Cluster:
    """A Dask scheduler and N worker processes (one per GPU, or per core on cpu), started here."""

    def __init__(self, n: int, device: str, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / "scheduler.json"
        env = {**os.environ, **NO_MULTICAST, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "2"}
        self.procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                        "--port", "0", "--no-dashboard", "--scheduler-file", str(self.file)],
                                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       preexec_fn=_child())]
        deadline = time.monotonic() + 120
        while not self.file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        cores = sorted(os.sched_getaffinity(0))
        res = "GPU" if device == "cuda" else "CPU"
        for i in range(n):
            wenv = dict(env)
            if device == "cuda":
                wenv["CUDA_VISIBLE_DEVICES"] = str(i)
            core = cores[i % len(cores)]
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(self.file), "--nthreads",
                 "1", "--nworkers", "1", "--resources", f"{res}=1", "--name", f"w{i}", "--no-dashboard",
                 "--local-directory", str(folder / f"w{i}")], env=wenv, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_child(core if device == "cpu" else None)))
        from distributed import Client

        self.client = Client(scheduler_file=str(self.file), set_as_default=False, timeout=120)
        self.client.wait_for_workers(n, timeout=300)
        self.address = self.client.scheduler.address

    def kill_worker(self, address: str) -> int:
        pid = self.client.run(os.getpid, workers=[address])[address]
        os.kill(pid, signal.SIGKILL)
        return int(pid)

    def close(self) -> None:
        self.client.close()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def node_rows(ws) -> list[dict]:
    from forge_tui.kernel_abi import SOURCE_NAMES
    from forge_tui.search.store import SearchStore

    rows = []
    with ws.git() as repo:
        store = SearchStore(repo)
        for r in store.load().nodes:
            if r.node == "root":
                continue
            src = next((raw for name in SOURCE_NAMES.values() if (raw := store.read(r.commit, name)) is not None), b"")
            result = json.loads(store.read(r.commit, "result.json") or b"{}")
            rows.append({"card": r.card, "node": r.node, "parent": r.parent, "move": r.move, "status": r.status,
                         "failure": result.get("failure"), "source": hashlib.sha256(src).hexdigest(),
                         "worker": (result.get("worker") or {}).get("address")})
    return rows


def run_search(base, dest: Path, cfg, pool_kind: str, n: int, backend: str, cluster: Cluster | None,
               kill: bool = False) -> dict:
    from forge_tui.cluster.events import ClusterStatus
    from forge_tui.cluster.pool import DaskEvalPool
    from forge_tui.search.events import EventBus
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.templates.proposer import TemplateProposer
    from forge_tui.workspace import Workspace

    shutil.copytree(base.root, dest)
    ws = Workspace.open(dest)
    bus = EventBus()
    killed: dict = {}
    if pool_kind == "cluster":
        assert cluster is not None
        # the workers' build cache starts empty, as the local pool's (in the fresh workspace) does
        shutil.rmtree(Path(os.environ["FORGE_CACHE_DIR"]) / "cluster" / "builds", ignore_errors=True)
        pool = DaskEvalPool(ws.store, cfg, scheduler=cluster.address, backend=backend, bus=bus, poll_s=0.2)
        if kill:
            def maybe_kill(e) -> None:  # mid-search: once one evaluation is back (at once in a short search)
                if killed or not isinstance(e, ClusterStatus) or not (any(w.done for w in e.workers) or cfg.search.max_evals <= 4):
                    return
                running = [f.worker for f in e.in_flight if f.worker]
                if running:
                    killed.update(address=running[0], at_done=sum(w.done for w in e.workers))
                    threading.Thread(target=lambda: killed.update(pid=cluster.kill_worker(running[0]))).start()

            bus.subscribe(maybe_kill)
    else:
        pool = LocalEvalPool(ws.store, ws.cache, cfg, backend=backend, workers=n)
    try:
        summary = Search(ws, cfg, TemplateProposer(), pool, bus=bus).run()
    finally:
        pool.close()
    rows = node_rows(ws)
    keys = [(r["card"], r["parent"], r["move"], r["source"]) for r in rows]
    return {"evaluations": summary.evaluations, "wall_s": summary.wall_s,
            "evals_per_min": 60.0 * summary.evaluations / max(summary.wall_s, 1e-9), "stopped": summary.stopped,
            "best": {c: b["speedup"] for c, b in summary.best.items() if b["node"] != "root"}, "nodes": rows,
            "duplicates": len(keys) - len(set(keys)), "worker_lost": sum(r["failure"] == "worker_lost" for r in rows),
            "killed": killed or None}


def agreement(a: list[dict], b: list[dict]) -> tuple[float | None, int]:
    """Fraction of the candidates (by source) both runs evaluated whose verdicts agree, and how many."""
    va = {(r["card"], r["source"]): VERDICT.get(r["status"], r["status"]) for r in a}
    vb = {(r["card"], r["source"]): VERDICT.get(r["status"], r["status"]) for r in b}
    common = set(va) & set(vb)
    return (sum(va[k] == vb[k] for k in common) / len(common) if common else None), len(common)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--workers", type=int, default=None, help="GPUs (cuda: every one visible) or CPU workers (cpu: 3)")
    ap.add_argument("--evals", type=int, default=None, help="evaluations per search (default 24; --small 4)")
    ap.add_argument("--small", action="store_true", help="kb_softmax only, few evaluations: a smoke run")
    ap.add_argument("--workloads", nargs="+", metavar="WORKLOAD", help="instead of the device's bundled pair")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.update(NO_MULTICAST)
    from forge_tui.config import parse_config
    from forge_tui.workspace import profile_into_workspace

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("cluster_bench: --device cuda needs CUDA GPUs (use --device cpu here)", file=sys.stderr)
            return 2
        n = args.workers or torch.cuda.device_count()
    else:
        n = args.workers or (2 if args.small else 3)
    evals = args.evals or (4 if args.small else 24)
    workloads = args.workloads or (["example:kb_softmax"] if args.small else WORKLOADS[args.device])
    out = args.out or Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-clusterbench-"))
    os.environ["FORGE_CACHE_DIR"] = str(tmp / "cache")  # its own: the cluster runs empty its build cache
    timing = {"warmup": 1, "repeats": 5, "threads": 1} if args.device == "cpu" else {}
    if args.small:
        timing.update(repeats=3, max_spread=10.0, max_slowdown=100.0)
    cfg = parse_config({"timing": timing, "search": {"max_evals": evals, "evals_per_card": evals, "parallel": 2 * n,
                                                     "min_gain": 0.0}, "pool": {"connect_timeout_s": 60.0}})
    (tmp / "forge.toml").write_text("[timing]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in timing.items()))
    report: dict = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "workers": n, "evals": evals,
                    "cpus": len(os.sched_getaffinity(0)), "host": os.uname().nodename,
                    "command": "python bench/cluster_bench.py " + " ".join(sys.argv[1:]), "workloads": {}}
    if args.device == "cuda":
        import torch

        report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    cluster = Cluster(n, args.device, tmp / "cluster")
    try:
        for w in workloads:
            name = w.split(":")[-1]
            base, _ = profile_into_workspace(w, tmp / name / "base", device=args.device, config_path=tmp / "forge.toml")
            runs = {}
            for label, kind, k in (("local-1", "local", 1), (f"local-{n}", "local", n), (f"cluster-{n}", "cluster", n)):
                runs[label] = run_search(base, tmp / name / label, cfg, kind, k, args.device, cluster)
                print(f"{name} {label}: {runs[label]['evaluations']} evaluations in {runs[label]['wall_s']:.1f} s",
                      file=sys.stderr, flush=True)
            runs["killed"] = run_search(base, tmp / name / "killed", cfg, "cluster", n, args.device, cluster, kill=True)
            for r in runs.values():
                r["agreement"], r["compared"] = agreement(runs["local-1"]["nodes"], r["nodes"])
            report["workloads"][name] = runs
    finally:
        cluster.close()
    (out / "cluster_bench.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def table(report: dict) -> str:
    lines = [f"cluster_bench {report['date']} {report['device']} x{report['workers']} on {report['host']} "
             f"({report['cpus']} cores{', ' + ', '.join(report['gpus']) if report.get('gpus') else ''})",
             f"{'workload':16s} {'run':11s} {'evals':>5s} {'wall s':>8s} {'evals/min':>9s} {'x local-1':>9s} "
             f"{'agree':>11s}  best speedup per card"]
    for name, runs in report["workloads"].items():
        one = runs["local-1"]["evals_per_min"]
        for label, r in runs.items():
            agree = f"{100 * r['agreement']:.0f}% of {r['compared']}" if r["agreement"] is not None else "-"
            best = ", ".join(f"{c[:18]} {s:.2f}x" for c, s in sorted(r["best"].items()) if s) or "none beat eager"
            lines.append(f"{name:16s} {label:11s} {r['evaluations']:5d} {r['wall_s']:8.1f} {r['evals_per_min']:9.2f} "
                         f"{r['evals_per_min'] / one:9.2f} {agree:>11s}  {best}")
        k = runs["killed"]
        lines.append(f"{name:16s} killed: worker {(k['killed'] or {}).get('address', 'none')} (pid "
                     f"{(k['killed'] or {}).get('pid', '-')}) after {(k['killed'] or {}).get('at_done', '-')} evaluations; "
                     f"search {k['stopped']}; {len(k['nodes'])} nodes, {k['duplicates']} duplicated, "
                     f"{k['worker_lost']} lost to dead workers")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
