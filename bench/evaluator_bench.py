"""The evaluator on the device machine: build times, the cost of one evaluation (and of the evaluator
before the judge/accused split, when its tree is given), timing noise, every attack rejected,
crashes contained, timing under load, Nsight Compute and compute-sanitizer reports.

    python bench/evaluator_bench.py [--old DIR]

--old DIR: a tree holding an earlier forge_tui package (e.g. `git archive OLD forge_tui | tar -x -C DIR`);
its evaluator is timed on the same card and candidate, in a process of its own.

Writes $OUT/evaluator.json; prints a table last.
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
CUDA = ROOT / "tests" / "candidates" / "cuda"
# (anticheat.md pattern or attack class, file)
ATTACKS = [
    ("1", "never_writes.cu"), ("2", "uninit_shared.cu"), ("4", "skip_rows.cu"), ("5", "mutate_input.cu"),
    ("8", "cache_by_pointer.cu"), ("9", "batch_and_skip.cu"), ("10", "side_stream.cu"),
    ("11", "background_thread.cu"), ("13", "no_kernel.cu"), ("13", "not_launched.cu"), ("13", "library_call.cu"),
    ("15", "downcast_bf16.cu"), ("judge in reach", "judge_python.cu"), ("baseline slowed", "spawn_busy.cu"),
    ("state across calls", "device_state.cu"), ("late work", "late_kernel.cu"),
    ("inputs never checked", "softmax_no_max.cu"),
]

OLD_EVAL = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from forge_tui.config import parse_config
from forge_tui.evaluator import EvalOptions, Evaluator
from forge_tui.workspace import Workspace
ws = Workspace(sys.argv[2])
card = next(c for c in ws.cards() if c.target == "aten._softmax.default")
cfg = parse_config({"timing": {"warmup": 3, "repeats": 20}, "evaluator": {"run_timeout_s": 60.0}})
src = open(sys.argv[3]).read()
out = []
with Evaluator(ws.store, ws.cache, cfg, backend="cuda") as ev:
    for i in range(4):
        r = ev.evaluate(card, src, EvalOptions(compile_baseline=True))
        out.append({"seconds": r["seconds"], "status": r["status"], "time_us": r.get("time_us"),
                    "speedup": r.get("speedup_vs_eager"), "reason": r.get("reason", "")[:300],
                    "eager_us": (r.get("timing") or {}).get("eager", {}).get("median")})
print("RESULT" + json.dumps(out))
"""

LOADS = {
    "2 busy CPU processes": [[sys.executable, "-c", "while True: pass"]] * 2,
    "a GPU copy loop in another process": [[sys.executable, "-c",
                                            "import torch\nx = torch.empty(1 << 28, device='cuda')\n"
                                            "y = torch.empty_like(x)\nwhile True: y.copy_(x)"]],
}


def evaluate(ev, card, source: str, options=None) -> dict:
    """The evaluation as the JSON this script writes (EvalResult.to_dict)."""
    return ev.evaluate(card, source, options).to_dict()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="a tree with an earlier forge_tui package, timed for comparison")
    args = ap.parse_args()
    import torch

    from forge_tui.config import parse_config
    from forge_tui.evaluator import EvalOptions, Evaluator
    from forge_tui.evaluator.build import Builder
    from forge_tui.workspace import profile_into_workspace

    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-evalbench-"))
    report: dict = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "command": "python bench/evaluator_bench.py" + (" --old DIR" if args.old else "")}
    rows: list[tuple[str, str, str]] = []
    results: dict = {}

    def show(*row: str) -> None:
        rows.append(row)
        print(f"{row[0]:26s} {row[1]:44s} {row[2]}", flush=True)
        report["rows"] = rows
        report["results"] = results
        (out / "evaluator.json").write_text(json.dumps(report, indent=1, default=str))

    # 1. build times: distinct sources one by one, then 8 in parallel
    good = (CUDA / "softmax_good.cu").read_text()
    b = Builder("cuda", tmp / "cache")
    seq = [b.build(good + f"\n// variant {i}\n").seconds for i in range(4)]
    t0 = time.perf_counter()
    par = b.build_many([good + f"\n// parallel {i}\n" for i in range(8)])
    par_wall = time.perf_counter() - t0
    report["build"] = {"sequential_s": seq, "median_s": statistics.median(seq), "parallel8_wall_s": par_wall,
                       "parallel8_each_s": [r.seconds for r in par], "cores": os.cpu_count()}
    show("build", "nvcc median / 8 parallel wall", f"{statistics.median(seq):.2f} s / {par_wall:.2f} s")

    # 2. a real card on the GPU
    cfg_path = tmp / "forge.toml"
    cfg_path.write_text("[timing]\nwarmup = 3\nrepeats = 20\n")
    ws, _ = profile_into_workspace(ROOT / "bench" / "workloads" / "softmax_fp32.py", tmp / "ws", device="cuda",
                                   config_path=cfg_path)
    card = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    cfg = parse_config({"timing": {"warmup": 3, "repeats": 20}, "evaluator": {"run_timeout_s": 20.0}})
    with Evaluator(ws.store, ws.cache, cfg, backend="cuda") as ev:
        for i in range(4):
            results[f"good-{i}"] = evaluate(ev, card, good, EvalOptions(compile_baseline=True))
        r0 = results["good-0"]
        t = r0["timing"]
        show("good", "status / confinement", f"{r0['status']} / {r0.get('confinement')}")
        if not t:
            print(json.dumps({k: v for k, v in r0.items() if k not in ("build",)}, indent=1, default=str)[:6000])
            return 1
        show("good", "candidate / eager / compile µs",
             f"{t['candidate']['median']:.1f} / {t['eager']['median']:.1f} / "
             f"{t['compile']['median'] if t['compile'] else float('nan'):.1f}")
        sp, sc = t["speedup_vs_eager"], t["speedup_vs_compile"] or {}
        show("good", "speedup vs eager [q1,q3] / vs compile [q1,q3]",
             f"{sp['median']:.3f} [{sp['q1']:.3f},{sp['q3']:.3f}] / {sc.get('median', float('nan')):.3f} "
             f"[{sc.get('q1', float('nan')):.3f},{sc.get('q3', float('nan')):.3f}]")
        cd, lat = t.get("compile_device") or {}, t.get("speedup_vs_compile_latency") or {}
        show("good", "compile device µs / basis / vs compile by latency",
             f"{cd.get('median', float('nan')):.1f} / {t.get('compile_basis')} / {lat.get('median', float('nan')):.3f}")
        meds = [results[f"good-{i}"]["timing"]["candidate"]["median"] for i in range(4)]
        show("good", "noise: blocks / four evaluations",
             f"{100 * t['noise']:.2f}% / {100 * (max(meds) - min(meds)) / min(meds):.2f}% ({', '.join(f'{m:.1f}' for m in meds)})")
        show("good", "calls per sample / checked calls", f"{t['calls_per_sample']} / {t['checked_timed_runs']}")
        show("good", "floor µs / reached / overheads µs",
             f"{t['floor_us']:.1f} / {100 * t['fraction_of_floor']:.0f}% / runner {t['overhead_us']['runner_round_trip']:.1f}, "
             f"judge {t['overhead_us']['judge_sync']:.1f}")
        secs = [results[f"good-{i}"]["seconds"] for i in range(1, 4)]
        report["cost_s"] = secs
        show("cost", "seconds per evaluation (build cached)", f"{statistics.median(secs):.2f} ({', '.join(f'{x:.2f}' for x in secs)})")
        show("quiet", "quiet / attempts / runner CPU while frozen",
             f"{t['quiet']} / {len(t['attempts'])} / {t['runner_cpu_while_frozen_ns']} ns")

        for pattern, name in ATTACKS:
            src = (CUDA / name).read_text()
            static = evaluate(ev, card, src)
            runtime = evaluate(ev, card, src, EvalOptions(static_checks=False, compile_baseline=False))
            results[f"{name}:static"] = static
            results[f"{name}:runtime"] = runtime
            extra = ""
            if runtime.get("time_us"):
                extra = f" ({runtime['time_us']:.1f} µs; the honest kernel {t['candidate']['median']:.1f})"
            show(f"{pattern}: {name}", f"static: {static['status']}/{static['failure']}",
                 f"runtime: {runtime['status']}/{runtime['failure']}: {runtime['reason'][:110]}{extra}")
        for name in ["illegal_address.cu", "endless.cu"]:
            r = evaluate(ev, card, (CUDA / name).read_text(), EvalOptions(compile_baseline=False))
            after = evaluate(ev, card, good, EvalOptions(compile_baseline=False))
            results[name] = r
            results[f"{name}:after"] = after
            show(name, f"{r['status']}: {r['reason'][:60]}", f"next candidate: {after['status']}, same judge")

        # 3. under load: a speedup within 20% of the quiet one, or "noisy"
        quiet = statistics.median(results[f"good-{i}"]["speedup_vs_eager"] or 0 for i in range(4))
        for label, cmds in LOADS.items():
            procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
            try:
                time.sleep(3)
                r = evaluate(ev, card, good, EvalOptions(compile_baseline=False))
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            results[f"load:{label}"] = r
            got = r.get("speedup_vs_eager")
            verdict = "noisy" if r["status"] == "noisy" else (
                f"{got:.3f}x, {100 * (got / quiet - 1):+.1f}% from quiet {quiet:.3f}x" if got else r["status"])
            show("load", label, f"{verdict}" + (f" ({'; '.join(r['timing']['noisy_reasons'])[:120]})"
                                                if r["status"] == "noisy" else ""))

        prof = evaluate(ev, card, good, EvalOptions(profile=True, sanitize=True, compile_baseline=False))
        results["profiled"] = prof
        p = prof.get("profile") or {}
        show("ncu", "available / duration µs / DRAM %",
             f"{p.get('available')} / {p.get('duration_us')} / {p.get('dram_throughput_pct')}" if p.get("available")
             else str(p.get("reason")))
        san = prof.get("sanitizer") or {}
        show("sanitizer good", f"status {prof['status']}",
             json.dumps({k: v.get("errors") for k, v in san.get("tools", {}).items()}))

    if args.old:
        src_path = tmp / "good.cu"
        src_path.write_text(good)
        old_root = args.old.resolve()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(old_root)] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT])}
        proc = subprocess.run([sys.executable, "-c", OLD_EVAL, str(old_root), str(ws.root), str(src_path)],
                              capture_output=True, text=True, timeout=900, cwd=old_root, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
        if line:
            old = json.loads(line[6:])
            report["old"] = old
            report["old_cost_s"] = [o["seconds"] for o in old[1:]]
            old_med = statistics.median(report["old_cost_s"])
            show("cost", "old evaluator: status / seconds / cand µs / eager µs",
                 f"{old[1]['status']} {old[1]['reason'][:80]} / {old_med:.2f} / {old[1]['time_us']} / "
                 f"{old[1]['eager_us']}; new/old cost {statistics.median(secs) / old_med:.2f}x")
        else:
            show("cost", "old evaluator", f"failed: {proc.stderr[-300:]}")
    report["results"] = results
    (out / "evaluator.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nevaluator bench on {report['gpu']}, torch {report['torch']}, {report['date']}")
    for r in rows:
        print(f"{r[0]:26s} {r[1]:44s} {r[2][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
