"""Asks: why does the e2e bench's process run torch.compile's ResNet-50 about 1.5x slower than a
fresh process does (H100, 2026-12-06, thirteenth session: 3145-3777 µs in the bench, 2095-2335 in
``compile_paths.py`` a minute later)? Is the compiled code different (Dynamo's graphs, dynamic
shapes, inductor's kernels), or does the same code run slower there?

This runs one workload through the e2e bench's own steps (``e2e_bench._run_workload``: profile,
fold, search, approve, the first bench, overheads, the four-way bench) in this process, not in a
child, and compiles a fresh ``torch.compile(model)`` three times: first thing, before the bench's
four-way bench, and after it. Each time it records what Dynamo did (its counters, and its
``dynamic``, ``recompiles`` and ``graph_breaks`` logs during the compile), the device kernels of one
forward (torch.profiler: their number, device time and names), and times, interleaved by CUDA
events, eager, the new compile and the one compiled first (the same code, run later).

    python bench/lab/compile_in_bench.py [resnet50] [--budget-s 200] [--reps 30] [--device cuda|cpu]
        [--keep-workspace DIR]

Prints a table; JSON to $OUT if set (with the bench's own record).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


class _Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage()[:300])
        except Exception:  # noqa: BLE001 - a log line that cannot format is left out
            pass


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {f"{k}/{n}": int(v) for k, c in counters.items() for n, v in c.items()}


def _kernels(run: Any, dev: str) -> dict[str, Any]:
    """One forward's device kernels (on the CPU: its aten ops and their self times)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU] if dev == "cuda"
                 else [ProfilerActivity.CPU]) as prof:
        run()
        _sync(dev)
    names: Counter[str] = Counter()
    device_us: Counter[str] = Counter()
    for e in prof.events():
        if dev == "cuda" and e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:90]] += 1
            device_us[e.name[:90]] += e.device_time
        elif dev == "cpu" and e.name.startswith("aten::"):
            names[e.name[:90]] += 1
            device_us[e.name[:90]] += e.self_cpu_time_total
    total = sum(device_us.values())
    top = [{"name": n, "calls": names[n], "us": round(device_us[n], 1)} for n, _ in device_us.most_common(12)]
    return {"kernels": sum(names.values()), "distinct": len(names), "device_us": round(total, 1), "top": top,
            "names": sorted(names)}


def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def _timed(run: Any, dev: str, sleep: bool = False) -> tuple[float, float]:
    """(the forward's time by CUDA events, or the host's clock on the CPU; the host's time to
    enqueue it), µs. ``sleep``: the device held busy first, so the events time its work alone."""
    import torch

    _sync(dev)
    if dev != "cuda":
        h0 = time.perf_counter()
        run()
        h = (time.perf_counter() - h0) * 1e6
        return h, h
    if sleep:
        torch.cuda._sleep(20_000_000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    a.record()
    run()
    b.record()
    h = (time.perf_counter() - h0) * 1e6
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000.0, h


def fresh_inductor() -> Any:
    """Inductor as a new backend object: Dynamo keeps its compiled code per backend, so a model
    compiled with it compiles afresh rather than reuse (or lend the bench) an earlier compile of
    the same forward's code."""
    def inductor(gm: Any, example: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example)

    return inductor


def probe(tag: str, spec: str, dev: str, reps: int, others: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    import torch

    from forge_tui.workload import load_workload

    wl = load_workload(spec)
    model, inputs = wl.build(dev, None)
    model.eval()
    grab = _Grab()
    torch._logging.set_logs(dynamic=logging.INFO, recompiles=True, graph_breaks=True)
    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch.fx.experimental.symbolic_shapes",
                                              "torch._inductor")]
    for lg in loggers:
        lg.addHandler(grab)
    before = _counters()
    compiled = torch.compile(copy.deepcopy(model), backend=fresh_inductor())
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            wl.run(compiled, inputs)
        _sync(dev)
    compile_s = time.perf_counter() - t0
    for lg in loggers:
        lg.removeHandler(grab)
    torch._logging.set_logs()
    after = _counters()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    with torch.no_grad():
        kern = _kernels(lambda: wl.run(compiled, inputs), dev)
        variants = {"eager": model, "compile": compiled, **(others or {})}
        times: dict[str, list[float]] = {n: [] for n in variants}
        host: dict[str, list[float]] = {n: [] for n in variants}
        for m in variants.values():
            wl.run(m, inputs)
        for _ in range(reps):
            for n, m in variants.items():
                t, h = _timed(lambda m=m: wl.run(m, inputs), dev)
                times[n].append(t)
                host[n].append(h)
        # the device's own time for the compiled forward, its host hidden behind a sleep
        dev_only = [_timed(lambda: wl.run(compiled, inputs), dev, sleep=True)[0] for _ in range(10)]
    row = {"tag": tag, "compile_s": round(compile_s, 1), "dynamo": delta, "logs": grab.lines[:60],
           "log_lines": len(grab.lines), "profile": kern, "times_us": times, "host_us": host,
           "compile_device_only_us": dev_only,
           "median_us": {n: statistics.median(v) for n, v in times.items()},
           "host_median_us": {n: statistics.median(v) for n, v in host.items()}}
    return row, compiled


def main() -> int:
    import e2e_bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default="resnet50")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--keep-workspace", metavar="DIR", help="copy the workspace the run left here")
    args = ap.parse_args()
    dev = args.device
    spec = f"example:{args.workload}"
    rows: list[dict[str, Any]] = []
    row, first = probe("first thing", spec, dev, args.reps)
    rows.append(row)

    import forge_tui.e2e as e2e

    orig = e2e.bench

    import torch

    theirs: list[Any] = []
    compile_ = torch.compile

    def keep(model: Any = None, **k: Any) -> Any:  # the bench's own torch.compile variant, kept to time later
        out = compile_(model, **k)
        if k.get("backend", "inductor") == "inductor":
            theirs.append(out)
        return out

    def bench(*a: Any, **k: Any) -> Any:
        if not k.get("with_compile"):
            return orig(*a, **k)
        rows.append(probe("before the bench's four-way bench", spec, dev, args.reps, {"compiled first": first})[0])
        torch.compile = keep
        try:
            return orig(*a, **k)
        finally:
            torch.compile = compile_

    e2e.bench = bench
    opts = e2e_bench.options(e2e_bench.build_parser().parse_args(
        [args.workload, "--budget-s", str(args.budget_s), "--device", dev]))
    tmp = Path(tempfile.mkdtemp(prefix="forge-cib-"))
    t_start = time.time()
    (tmp / "w").mkdir()
    rec = e2e_bench.Record(tmp / "record.json", args.workload, t_start)
    try:
        e2e_bench._run_workload(args.workload, opts, t_start + args.budget_s, rec, tmp / "w")
    finally:
        e2e.bench = orig
    if args.keep_workspace and (tmp / "w" / "ws").is_dir():
        import shutil

        shutil.copytree(tmp / "w" / "ws", Path(args.keep_workspace) / args.workload, symlinks=True, dirs_exist_ok=True)
    others = {"compiled first": first} | ({"the bench's compile": theirs[-1]} if theirs else {})
    rows.append(probe("after the bench", spec, dev, args.reps, others)[0])
    bench_compile = (rec.data.get("bench") or {}).get("times_us", {}).get("compile")
    print(f"\n{args.workload}: the bench's own torch.compile variant: "
          f"{bench_compile.get('median') if isinstance(bench_compile, dict) else bench_compile} µs")
    print(f"{'probe':36s} {'eager':>8s} {'compile':>8s} {'first':>8s} {'bench':>8s} {'c. host':>8s} {'c. dev':>8s} "
          f"{'kernels':>8s} {'prof µs':>8s} {'compile s':>9s}  dynamo")
    nan = float("nan")
    for r in rows:
        m, h = r["median_us"], r["host_median_us"]
        dyn = {k: v for k, v in r["dynamo"].items() if v}
        print(f"{r['tag']:36s} {m['eager']:8.0f} {m['compile']:8.0f} {m.get('compiled first', nan):8.0f} "
              f"{m.get('the bench' + chr(39) + 's compile', nan):8.0f} "
              f"{h['compile']:8.0f} {statistics.median(r['compile_device_only_us']):8.0f} "
              f"{r['profile']['kernels']:8d} {r['profile']['device_us']:8.0f} {r['compile_s']:9.1f}  {dyn}")
        for line in r["logs"][:12]:
            print(f"    log: {line[:200]}")
    base = set(rows[0]["profile"]["names"])
    for r in rows[1:]:
        names = set(r["profile"]["names"])
        print(f"kernels {r['tag']}: {len(names - base)} new, {len(base - names)} gone")
        for n in sorted(names - base)[:10]:
            print(f"    new: {n}")
        for n in sorted(base - names)[:10]:
            print(f"    gone: {n}")
    out = os.environ.get("OUT")
    if out:
        Path(out, f"compile_in_bench-{args.workload}.json").write_text(json.dumps(
            {"rows": rows, "bench_record": rec.data}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
