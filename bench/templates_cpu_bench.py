"""The template proposer on the cpu backend, on this machine: fused families against eager.

    python bench/templates_cpu_bench.py [--evals 4] [--only NAME ...]

Same procedure as bench/templates_bench.py (profile a one-op workload, template search, best
paired speedup), on the CPU. Writes bench-out/templates_cpu.json (or $OUT); prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CASES = {
    "rms_norm_hf_fp32_8192x1024": ("float32", "MODULE:RMSNorm", [(8192, 1024)], "module:RMSNorm"),
    "silu_mul_fp32_8192x2048": ("float32", "MODULE:SiluMul", [(8192, 2048), (8192, 2048)], "module:SiluMul"),
    "group_norm_fp32_16x64x128x128": ("float32", "return F.group_norm(x, 32, self.gw, self.gb, 1e-5)",
                                      [(16, 64, 128, 128)], "aten.native_group_norm"),
    "softmax_fp32_8192x1024": ("float32", "return torch.softmax(x, -1)", [(8192, 1024)], "aten._softmax"),
    "layer_norm_fp32_8192x1024": ("float32", "return F.layer_norm(x, x.shape[-1:], self.w, self.b, 1e-5)",
                                  [(8192, 1024)], "aten.native_layer_norm"),
}


def main() -> int:
    from templates_bench import workload_source

    from forge_tui.config import parse_config
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.search.store import SearchStore
    from forge_tui.templates.proposer import TemplateProposer
    from forge_tui.workspace import profile_into_workspace

    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=4)
    ap.add_argument("--only", nargs="*", help="run the cases whose names contain one of these")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-cpubench-"))
    os.environ.setdefault("FORGE_CACHE_DIR", str(tmp / "cache"))
    (tmp / "forge.toml").write_text("[timing]\nwarmup = 2\nrepeats = 10\n")
    cfg = parse_config({"timing": {"warmup": 2, "repeats": 10},
                        "search": {"max_evals": args.evals, "parallel": 1, "min_gain": 0.0}})
    report = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
              "command": "python bench/templates_cpu_bench.py " + " ".join(sys.argv[1:]), "cases": {}}
    for k, (name, (dtype, body, shapes, target)) in enumerate(CASES.items()):
        if args.only and not any(o in name for o in args.only):
            continue
        wl = tmp / f"w{k}.py"
        wl.write_text(workload_source(dtype, body, shapes))
        ws, _ = profile_into_workspace(wl, tmp / f"ws{k}", device="cpu", config_path=tmp / "forge.toml")
        card = max((c for c in ws.cards() if c.target.startswith(target)), key=lambda c: c.bytes)
        pool = LocalEvalPool(ws.store, ws.cache, cfg, backend="cpu")
        try:
            Search(ws, cfg, TemplateProposer(), pool, cards=[card.id]).run()
        finally:
            pool.close()
        rows = []
        with ws.git() as repo:
            st = SearchStore(repo)
            for r in st.load().nodes:
                if r.node == "root":
                    continue
                res = json.loads(st.read(r.commit, "result.json") or b"{}")
                t = res.get("timing") or {}
                rows.append({"move": r.move, "status": r.status, "speedup": res.get("speedup_vs_eager"),
                             "q1": (t.get("speedup_vs_eager") or {}).get("q1"),
                             "q3": (t.get("speedup_vs_eager") or {}).get("q3"),
                             "ours_us": res.get("time_us"), "eager_us": (t.get("eager") or {}).get("median")})
        ok = [r for r in rows if r["status"] == "passed" and r["speedup"]]
        best = max(ok, key=lambda r: r["speedup"]) if ok else None
        report["cases"][name] = {"card": card.id, "nodes": rows, "best": best}
        (out / "templates_cpu.json").write_text(json.dumps(report, indent=1))
    print(f"\ntemplates on the cpu backend, {report['date']}, {report['cores']} cores")
    print(f"{'case':32s} {'eager µs':>10s} {'ours µs':>10s} {'speedup [q1, q3]':>22s}  best configuration")
    for name, c in report["cases"].items():
        b = c["best"]
        if b is None:
            print(f"{name:32s} no passing candidate")
            continue
        print(f"{name:32s} {b['eager_us']:10.1f} {b['ours_us']:10.1f} {b['speedup']:8.2f}x [{b['q1']:.2f}, {b['q3']:.2f}]  {b['move']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
