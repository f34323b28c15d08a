"""Git bookkeeping of the search, on the machine it runs on (CPU only; run it on a CI-like box).

    python bench/search_git_bench.py [--nodes 2000]

1. A real search on the cpu backend (bundled KernelBench softmax, scripted proposer, real builds
   and evaluations): share of its wall time spent in git.
2. A synthetic search of N nodes with instant fake evaluations: git milliseconds per node.
3. ``forge replay`` of that N-node workspace, as a user runs it (a fresh process) and in-process.
Prints a table; writes bench-out/search_git.json (or $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    args = ap.parse_args()
    from search_helpers import CountingProposer, FakePool, make_workspace, synthetic_card

    from forge_tui.config import parse_config
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.proposer import ScriptedProposer
    from forge_tui.search.replay import load_events
    from forge_tui.search.runner import Search
    from forge_tui.workspace import profile_into_workspace

    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-gitbench-"))
    os.environ.setdefault("FORGE_CACHE_DIR", str(tmp / "cache"))
    report: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count(),
                    "command": f"python bench/search_git_bench.py --nodes {args.nodes}"}

    # 1. a real search
    cfg_path = tmp / "forge.toml"
    cfg_path.write_text("[timing]\nwarmup = 2\nrepeats = 10\n")
    ws, _ = profile_into_workspace("example:kb_softmax", tmp / "real", device="cpu", config_path=cfg_path)
    good = (ROOT / "tests" / "candidates" / "cpu" / "softmax_good.cpp").read_text()
    plan = {"cards": {"_softmax": [{"source": good + f"\n// variant {i}\n", "move": f"variant {i}"} for i in range(12)]}}
    cfg = parse_config({"timing": {"warmup": 2, "repeats": 10}, "search": {"max_evals": 12, "parallel": 2,
                                                                         "min_gain": 0.0}})
    pool = LocalEvalPool(ws.store, ws.cache, cfg, backend="cpu")
    try:
        s = Search(ws, cfg, ScriptedProposer(plan), pool).run()
    finally:
        pool.close()
    report["real"] = {"evaluations": s.evaluations, "wall_s": s.wall_s, "git_s": s.git_s,
                      "git_fraction": s.git_s / s.wall_s}

    # 2. synthetic nodes
    ws2 = make_workspace(tmp / "synthetic", [synthetic_card("a", 0.6, 100.0, 1.0), synthetic_card("b", 0.3, 100.0, 1.0)])
    cfg2 = parse_config({"search": {"max_evals": args.nodes, "evals_per_card": args.nodes, "parallel": 4,
                                    "min_gain": 0.0}})
    pool2 = FakePool(speedup=lambda card, src: 1.0 + (hash(src) % 100) / 100)
    s2 = Search(ws2, cfg2, CountingProposer(), pool2).run()
    pool2.close()
    report["synthetic"] = {"nodes": s2.evaluations, "wall_s": s2.wall_s, "git_s": s2.git_s,
                           "git_ms_per_node": 1000 * s2.git_s / max(s2.evaluations, 1)}

    # 3. replay
    forge = str(Path(sys.executable).parent / "forge")
    cli = []
    for _ in range(3):
        t0 = time.perf_counter()
        proc = subprocess.run([forge, "replay", str(ws2.root)], capture_output=True, text=True)
        cli.append(time.perf_counter() - t0)
        assert proc.returncode == 0, proc.stderr
    inproc = []
    for _ in range(3):
        t0 = time.perf_counter()
        events = load_events(ws2)
        inproc.append(time.perf_counter() - t0)
    report["replay"] = {"nodes": sum(e.kind == "node_added" for e in events), "cli_s": cli,
                        "cli_median_s": statistics.median(cli), "in_process_s": inproc,
                        "in_process_median_s": statistics.median(inproc)}
    (out / "search_git.json").write_text(json.dumps(report, indent=1))
    r, sy, rp = report["real"], report["synthetic"], report["replay"]
    print(f"\nsearch git bench, {report['date']}, {report['cpu_cores']} cores")
    print(f"real search (cpu backend)   {r['evaluations']} evaluations in {r['wall_s']:.1f} s, git {r['git_s']:.3f} s "
          f"= {100 * r['git_fraction']:.2f}% of wall time")
    print(f"synthetic search            {sy['nodes']} nodes, git {sy['git_ms_per_node']:.2f} ms per node")
    print(f"forge replay ({rp['nodes']} nodes)  CLI {rp['cli_median_s']:.2f} s (median of 3), "
          f"in-process {rp['in_process_median_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
