"""The evaluator on the device machine: build times, timing noise, every cheat rejected, crashes
contained, Nsight Compute and compute-sanitizer reports.

    python bench/evaluator_bench.py

Writes $OUT/evaluator.json (and ncu_raw.csv); prints a table last.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CUDA = ROOT / "tests" / "candidates" / "cuda"
CHEATS = ["never_writes.cu", "uninit_shared.cu", "skip_rows.cu", "mutate_input.cu", "cache_by_pointer.cu",
          "batch_and_skip.cu", "side_stream.cu", "background_thread.cu", "no_kernel.cu", "not_launched.cu",
          "library_call.cu", "downcast_bf16.cu"]


def load_inline_seconds(tmp: Path) -> float:
    from torch.utils.cpp_extension import load_inline

    cuda_src = (CUDA / "softmax_good.cu").read_text().split("FORGE_EXPORT")[0].replace('#include "forge_kernel.h"', "")
    cuda_src += """
#include <torch/extension.h>
torch::Tensor softmax(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t cols = x.size(-1), rows = x.numel() / cols;
    softmax_rows<<<(unsigned)rows, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}"""
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load_inline(name=f"forge_bench_softmax_{os.getpid()}", cpp_sources="torch::Tensor softmax(torch::Tensor x);",
                cuda_sources=cuda_src, functions=["softmax"], build_directory=str(tmp), verbose=False,
                extra_cuda_cflags=["-O3", "-arch=sm_90"])
    return time.perf_counter() - t0


def main() -> int:
    import torch

    from forge_tui.config import parse_config
    from forge_tui.evaluator import EvalOptions, Evaluator
    from forge_tui.evaluator.build import Builder
    from forge_tui.profiler.run import profile_into_workspace

    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-evalbench-"))
    report: dict = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "command": "python bench/evaluator_bench.py"}
    rows: list[tuple[str, str, str]] = []

    # 1. build times: distinct sources one by one, then 8 in parallel, then torch's load_inline
    good = (CUDA / "softmax_good.cu").read_text()
    b = Builder("cuda", tmp / "cache")
    seq = [b.build(good + f"\n// variant {i}\n").seconds for i in range(6)]
    t0 = time.perf_counter()
    par = b.build_many([good + f"\n// parallel {i}\n" for i in range(8)])
    par_wall = time.perf_counter() - t0
    cached = b.build(good + "\n// variant 0\n")
    li = load_inline_seconds(tmp / "li")
    report["build"] = {"sequential_s": seq, "median_s": statistics.median(seq), "parallel8_wall_s": par_wall,
                       "parallel8_each_s": [r.seconds for r in par], "cached_s": cached.seconds,
                       "cached": cached.cached, "load_inline_s": li, "cores": os.cpu_count()}
    rows.append(("build", "nvcc median / 8 parallel wall / load_inline",
                 f"{statistics.median(seq):.2f} s / {par_wall:.2f} s / {li:.1f} s"))

    # 2. a real card on the GPU
    cfg_path = tmp / "forge.toml"
    cfg_path.write_text("[timing]\nwarmup = 3\nrepeats = 20\n")
    ws, _ = profile_into_workspace(ROOT / "bench" / "workloads" / "softmax_fp32.py", tmp / "ws", device="cuda",
                                   config_path=cfg_path)
    card = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    cfg = parse_config({"timing": {"warmup": 3, "repeats": 20}, "evaluator": {"run_timeout_s": 20.0}})
    results = {}
    with Evaluator(ws.store, ws.cache, cfg, backend="cuda") as ev:
        for i in range(2):
            r = ev.evaluate(card, good, EvalOptions(compile_baseline=True))
            results[f"good-{i}"] = r
        t = results["good-0"]["timing"]
        m0, m1 = results["good-0"]["time_us"], results["good-1"]["time_us"]
        rows.append(("good", "candidate / eager / compile µs",
                     f"{t['candidate']['median']:.1f} / {t['eager']['median']:.1f} / "
                     f"{t['compile']['median'] if t['compile'] else float('nan'):.1f}"))
        rows.append(("good", "speedup vs eager [q1,q3] / vs compile",
                     f"{t['speedup_vs_eager']['median']:.3f} [{t['speedup_vs_eager']['q1']:.3f},"
                     f"{t['speedup_vs_eager']['q3']:.3f}] / {results['good-0']['speedup_vs_compile'] or float('nan'):.3f}"))
        rows.append(("good", "noise: blocks / two evaluations",
                     f"{100 * t['noise']:.2f}% / {100 * abs(m0 - m1) / min(m0, m1):.2f}%"))
        rows.append(("good", "floor µs / fraction reached / sync overhead µs",
                     f"{t['floor_us']:.1f} / {100 * t['fraction_of_floor']:.0f}% / {t['overhead_us'][0]:.1f}"))
        for name in CHEATS:
            src = (CUDA / name).read_text()
            static = ev.evaluate(card, src)
            runtime = ev.evaluate(card, src, EvalOptions(static_checks=False, compile_baseline=False))
            results[f"{name}:static"] = static
            results[f"{name}:runtime"] = runtime
            rows.append((name, f"static: {static['status']}/{static['failure']}",
                         f"runtime: {runtime['status']}/{runtime['failure']}: {runtime['reason'][:90]}"))
        for name in ["illegal_address.cu", "endless.cu"]:
            r = ev.evaluate(card, (CUDA / name).read_text(), EvalOptions(compile_baseline=False))
            after = ev.evaluate(card, good, EvalOptions(compile_baseline=False))
            results[name] = r
            results[f"{name}:after"] = after
            rows.append((name, f"{r['status']}: {r['reason'][:80]}", f"next candidate: {after['status']}"))
        prof = ev.evaluate(card, good, EvalOptions(profile=True, sanitize=True, compile_baseline=False))
        results["profiled"] = prof
        p = prof.get("profile") or {}
        if p.get("raw_csv"):
            (out / "ncu_raw.csv").write_text(p["raw_csv"])
        rows.append(("ncu", "available / duration µs / DRAM % / occupancy %",
                     f"{p.get('available')} / {p.get('duration_us')} / {p.get('dram_throughput_pct')} / "
                     f"{p.get('achieved_occupancy_pct')}" if p.get("available") else str(p.get("reason"))))
        san = prof.get("sanitizer") or {}
        rows.append(("sanitizer good", f"status {prof['status']}", json.dumps({k: v.get('errors') for k, v in san.get('tools', {}).items()})))
        bad = ev.evaluate(card, (CUDA / "uninit_shared.cu").read_text(),
                          EvalOptions(static_checks=False, sanitize=True, timing=False, compile_baseline=False))
        results["uninit_sanitized"] = bad
        rows.append(("sanitizer uninit", f"{bad['status']}/{bad['failure']}", bad["reason"][:100]))
    report["results"] = results
    (out / "evaluator.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nevaluator bench on {report['gpu']}, torch {report['torch']}, {report['date']}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:48s} {r[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
