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
    python bench/lab/compile_in_bench.py resnet50 --steps WS    # the bench's setup step by step

Prints a table; JSON to $OUT if set (with the bench's own record).

Answer (H100, 2026-12-06, fourteenth session, calls 1-8, docs/runs/data/2026-12-06-s14): the
compiled code is the same in and out of the bench (131 kernels of the same names, one Dynamo graph,
no recompile or graph break while timed), and the same costs on the host for plain Python, buffer
allocation (8 KiB to 100 MiB), a small launch and a convolution. The compiled ResNet-50 is bound by
its host: 1.73-1.77 ms of device work, 2.5-5.9 ms a forward, tracking the host's speed, which
drifted up to 2x within a call (eager 4.3 to 13 ms). Inside the bench's four-way timing, compiled
forwards ran 1.35-1.5x slower by CUDA events than in the same process just before and after it
(the model compiled first: 2613 µs before, 3960 inside, 2608 after, eager 5215 / 5571 / 5247), and
stayed slow with the bench's state taken away a step at a time (the collector unfrozen, both
applies undone, the variants dropped, the allocator's cache emptied); what ran just before a
compiled forward made no difference (a fresh process: 1970-2026 µs after each variant). The cause
is not found; in these calls the probe swapped ``torch.compile`` for the bench's duration, the one
thing it put back on leaving, so that swap is not ruled out for its own readings (the bench alone
showed the same figures); since then it takes the bench's baseline from the bench's frame. The
bench measured torch.compile + forge 1.25-1.39x torch.compile in four of seven runs (0.89-0.95x in
the others), processes of their own 0.64-0.93x in all five: since ``ed845b8`` a verdict to keep
forge's kernels under torch.compile is timed again in a process of its own
(``forge_tui.compile_pair``), and that one decides.
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


def cpu_snapshot() -> dict[str, Any]:
    """The machine's CPU jiffies (busy, all) and each process's (utime + stime, its name and
    parent), from /proc; empty where there is no /proc."""
    snap: dict[str, Any] = {"t": time.perf_counter(), "pids": {}}
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return {}
    snap["all"], snap["busy"] = sum(fields[:8]), sum(fields[:8]) - fields[3] - fields[4]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        snap["pids"][int(d.name)] = (comm, int(rest[1]), int(rest[11]) + int(rest[12]))
    return snap


def cpu_window(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Between two snapshots: the machine's busy cores on average, this process's and its
    descendants', and the five busiest other processes (cores on average)."""
    if not a or not b:
        return {}
    wall = max(b["t"] - a["t"], 1e-6)
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    used = {p: (v[2] - a["pids"].get(p, (None, None, 0))[2]) / hz / wall for p, v in b["pids"].items()}
    kids: dict[int, list[int]] = {}
    for p, v in b["pids"].items():
        kids.setdefault(v[1], []).append(p)
    tree, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo.extend(kids.get(p, []))
    others = sorted(((u, p) for p, u in used.items() if p not in tree), reverse=True)[:5]
    return {"busy_cores": round((b["busy"] - a["busy"]) / max(b["all"] - a["all"], 1) * ncpu, 2),
            "self_cores": round(used.get(os.getpid(), 0.0), 2),
            "tree_cores": round(sum(used.get(p, 0.0) for p in tree), 2), "tree_pids": len(tree),
            "top_others": [(b["pids"][p][0], p, round(u, 2)) for u, p in others]}


def host_micro(dev: str) -> dict[str, float]:
    """The host's cost of a few calls a compiled forward makes (µs a call, best of three rounds):
    plain Python, inductor's buffer allocation, a small op's launch, an extern convolution."""
    import torch

    def per_call(fn: Any, n: int) -> float:
        best = float("inf")
        for _ in range(3):
            fn()
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            _sync(dev)
        return round(best, 2)

    x = torch.zeros(256, device=dev)
    w = torch.randn(8, 8, 3, 3, device=dev, dtype=torch.float16)
    a = torch.randn(1, 8, 8, 8, device=dev, dtype=torch.float16)
    out = {"python: sum(range(1000))": per_call(lambda: sum(range(1000)), 500),
           "torch.empty_strided": per_call(lambda: torch.empty_strided((64, 64), (64, 1), device=dev), 2000),
           "x.add_(1)": per_call(lambda: x.add_(1), 2000),
           "aten.convolution, small": per_call(lambda: torch.ops.aten.convolution(
               a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), 500)}
    if dev == "cuda":
        from torch._C._dynamo.guards import _empty_strided_cuda

        out["_empty_strided_cuda (inductor's)"] = per_call(
            lambda: _empty_strided_cuda((64, 64), (64, 1), torch.float16), 2000)
        out["_empty_strided_cuda, 25 MiB"] = per_call(
            lambda: _empty_strided_cuda((64, 256, 28, 28), (200704, 1, 7168, 256), torch.float16), 2000)
        big = [torch.empty(1 << 20, device=dev) for _ in range(8)]

        def churn() -> None:  # allocations and frees of several sizes, as a forward makes them
            a = _empty_strided_cuda((64, 256, 56, 56), (802816, 1, 14336, 256), torch.float16)
            b = _empty_strided_cuda((64, 64, 56, 56), (200704, 1, 3584, 64), torch.float16)
            c = _empty_strided_cuda((64, 512, 28, 28), (401408, 1, 14336, 512), torch.float16)
            del a, b, c

        out["three allocations of 6-100 MiB, freed"] = per_call(churn, 1000)
        del big
    return out


def process_state() -> dict[str, Any]:
    """What could make every call slower process-wide: module hooks, torch function and dispatch
    modes, a profiler or tracer, threads, Dynamo's callback, the garbage collector."""
    import gc
    import threading

    import torch
    import torch.nn.modules.module as mm

    out: dict[str, Any] = {n: len(getattr(mm, n)) for n in dir(mm) if n.startswith("_global_") and
                           isinstance(getattr(mm, n), dict)}
    out["torch_function_stack"] = torch._C._len_torch_function_stack()
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        out["dispatch_modes"] = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
    except ImportError:
        pass
    out["profile"], out["trace"] = repr(sys.getprofile()), repr(sys.gettrace())
    out["threads"] = sorted(t.name for t in threading.enumerate())
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback

        out["eval_frame_callback"] = repr(get_eval_frame_callback())[:120]
    except ImportError:
        pass
    out["grad"], out["inference_mode"] = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    out["gc"] = {"enabled": gc.isenabled(), "counts": gc.get_count(), "frozen": gc.get_freeze_count()}
    out["autograd_profiler"] = torch.autograd.profiler._is_profiler_enabled
    return out


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
    host_us: Counter[str] = Counter()
    host_n: Counter[str] = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU:
            host_us[e.name[:60]] += e.self_cpu_time_total
            host_n[e.name[:60]] += 1
        if dev == "cuda" and e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:90]] += 1
            device_us[e.name[:90]] += e.device_time
        elif dev == "cpu" and e.name.startswith("aten::"):
            names[e.name[:90]] += 1
            device_us[e.name[:90]] += e.self_cpu_time_total
    total = sum(device_us.values())
    top = [{"name": n, "calls": names[n], "us": round(device_us[n], 1)} for n, _ in device_us.most_common(12)]
    return {"kernels": sum(names.values()), "distinct": len(names), "device_us": round(total, 1), "top": top,
            "names": sorted(names), "host_self_us": round(sum(host_us.values()), 1),
            "host_top": [(n, host_n[n], round(v, 1)) for n, v in host_us.most_common(10)]}


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


def _interleaved(wl: Any, variants: dict[str, Any], inputs: Any, reps: int,
                 dev: str) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, Any]]:
    """Each variant's forward once, then ``reps`` rounds of all of them timed (``_timed``): the
    samples, the host's times to enqueue them, and the CPU's load meanwhile (``cpu_window``)."""
    times: dict[str, list[float]] = {n: [] for n in variants}
    host: dict[str, list[float]] = {n: [] for n in variants}
    for m in variants.values():
        wl.run(m, inputs)
    c0 = cpu_snapshot()
    for _ in range(reps):
        for n, m in variants.items():
            t, h = _timed(lambda m=m: wl.run(m, inputs), dev)
            times[n].append(t)
            host[n].append(h)
    return times, host, cpu_window(c0, cpu_snapshot())


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
        times, host, cpu = _interleaved(wl, {"eager": model, "compile": compiled, **(others or {})}, inputs, reps,
                                        dev)
        # the device's own time for the compiled forward, its host hidden behind a sleep
        dev_only = [_timed(lambda: wl.run(compiled, inputs), dev, sleep=True)[0] for _ in range(10)]
    row = {"tag": tag, "micro_us": host_micro(dev), "compile_s": round(compile_s, 1), "dynamo": delta, "logs": grab.lines[:60],
           "log_lines": len(grab.lines), "profile": kern, "times_us": times, "host_us": host,
           "compile_device_only_us": dev_only, "cpu": cpu,
           "median_us": {n: statistics.median(v) for n, v in times.items()},
           "host_median_us": {n: statistics.median(v) for n, v in host.items()}}
    return row, compiled


def steps(spec: str, ws: str, dev: str, reps: int) -> list[dict[str, Any]]:
    """The e2e bench's four-way setup (``e2e.bench``) rebuilt one step at a time on workspace
    ``ws``, the baseline ``torch.compile(model)`` timed by CUDA events (with the host's time to
    enqueue it) after each step; then the bench's own protocol (``Timer.time`` over the four
    variants, the garbage collector frozen as ``GcPauses`` does), then undone step by step."""
    import torch

    from forge_tui.e2e import GcPauses
    from forge_tui.runtime.apply import Mode, apply
    from forge_tui.timing import Timer
    from forge_tui.workload import load_workload

    wl = load_workload(spec)
    model, inputs = wl.build(dev, None)
    model.eval()
    out: list[dict[str, Any]] = []
    base = torch.compile(copy.deepcopy(model), backend=fresh_inductor())

    def time_it(tag: str, extra: dict[str, Any] | None = None) -> None:
        with torch.no_grad():
            times, host, cpu = _interleaved(wl, {"eager": model, "compile": base, **(extra or {})}, inputs, reps, dev)
        row = {"tag": tag, "median_us": {n: statistics.median(v) for n, v in times.items()},
               "host_median_us": {n: statistics.median(v) for n, v in host.items()}, "cpu": cpu}
        out.append(row)
        print(f"  {tag:58s} " + "  ".join(f"{n} {v:7.0f} (host {row['host_median_us'][n]:6.0f})"
                                         for n, v in row["median_us"].items()) + f"  cpu {row['cpu']}", flush=True)

    time_it("compiled, nothing else")
    fm = copy.deepcopy(model)
    applied = apply(fm, ws, mode=Mode.INFERENCE, device=dev, trial_calls=0)
    time_it("eager + forge applied, not run")
    with torch.no_grad():
        wl.run(fm, inputs)
    time_it("eager + forge run once", {"eager+forge": fm})
    cf = copy.deepcopy(model)
    capplied = apply(cf, ws, mode=Mode.TORCH_COMPILE, device=dev)
    cfc = torch.compile(cf, backend=capplied.backend("inductor"))
    with torch.no_grad():
        wl.run(cfc, inputs)
    time_it("torch.compile + forge compiled and run", {"eager+forge": fm, "compile+forge": cfc})
    fns = {"eager": model, "eager+forge": fm, "compile": base, "compile+forge": cfc}
    # does what ran just before a compiled forward change its time? each variant run (untimed,
    # the device synchronised after it), then the baseline timed; rounds interleaved
    after: dict[str, list[float]] = {n: [] for n in fns}
    with torch.no_grad():
        for _ in range(reps):
            for n, m in fns.items():
                wl.run(m, inputs)
                _sync(dev)
                after[n].append(_timed(lambda: wl.run(base, inputs), dev)[0])
    row = {"tag": "the baseline timed right after each variant", "median_us": {
        n: statistics.median(v) for n, v in after.items()}}
    out.append(row)
    print(f"  {row['tag']:58s} " + "  ".join(f"after {n} {v:7.0f}" for n, v in row["median_us"].items()), flush=True)
    timer = Timer(dev, warmup=3, repeats=reps, cold_l2=False)
    pauses = GcPauses()
    with torch.no_grad(), pauses:
        stats, _, overhead = timer.time({n: (lambda m=m, n=n: pauses.run(n, wl.run, m, inputs))
                                         for n, m in fns.items()})
    row = {"tag": "the bench's protocol (Timer.time, GcPauses)", "median_us": {n: s.median for n, s in stats.items()},
           "overhead_us": overhead, "gc": pauses.notes()}
    out.append(row)
    print(f"  {row['tag']:58s} " + "  ".join(f"{n} {v:7.0f}" for n, v in row["median_us"].items()) +
          f"  (overhead {overhead:.0f}; {pauses.notes()})", flush=True)
    with torch.no_grad():
        stats, _, overhead = timer.time({"eager": lambda: wl.run(model, inputs), "compile": lambda: wl.run(base, inputs)})
    row = {"tag": "Timer.time, eager and compile alone", "median_us": {n: s.median for n, s in stats.items()}}
    out.append(row)
    print(f"  {row['tag']:58s} " + "  ".join(f"{n} {v:7.0f}" for n, v in row["median_us"].items()), flush=True)
    time_it("events again", {"eager+forge": fm, "compile+forge": cfc})
    applied.undo()
    time_it("eager + forge undone", {"compile+forge": cfc})
    capplied.undo()
    time_it("torch.compile + forge undone")
    return out


def main() -> int:
    import e2e_bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default="resnet50")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--keep-workspace", metavar="DIR", help="copy the workspace the run left here")
    ap.add_argument("--undo-steps", action="store_true", help="inside the bench, after its timing, take away "
                    "its state a step at a time, timing the first compile after each (the bench then stops)")
    ap.add_argument("--steps", metavar="WS", help="only the bench's four-way setup, step by step, on this workspace")
    args = ap.parse_args()
    dev = args.device
    spec = f"example:{args.workload}"
    if args.steps:
        print(f"{args.workload}: the bench's setup step by step, medians of {args.reps} forwards, µs")
        rows = steps(spec, args.steps, dev, args.reps)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"compile_steps-{args.workload}.json").write_text(json.dumps(rows, indent=1))
        return 0
    rows: list[dict[str, Any]] = []
    row, first = probe("first thing", spec, dev, args.reps)
    rows.append(row)
    from forge_tui.workload import load_workload

    wl0 = load_workload(spec)
    _, inputs0 = wl0.build(dev, None)
    first_args = (first, inputs0)
    first_run = wl0.run

    def first_call(m: Any, x: Any) -> Any:
        return first_run(m, x)

    import forge_tui.e2e as e2e

    orig = e2e.bench

    theirs: list[Any] = []
    """The bench's own torch.compile variant, taken from its frame when it times (nothing swapped:
    the fourteenth session's calls 1-8 swapped ``torch.compile`` for the bench's duration)."""

    from forge_tui.timing import Timer

    timer_time = Timer.time
    timed: list[dict[str, Any]] = []

    def events(fns: Any) -> dict[str, float]:  # the bench's callables, timed by CUDA events here
        import torch

        times: dict[str, list[float]] = {n: [] for n in fns}
        with torch.no_grad():
            for _ in range(10):
                for n, fn in fns.items():
                    times[n].append(_timed(fn, dev)[0])
                t = _timed(lambda: first_call(*first_args), dev)[0]
                times.setdefault("compiled first", []).append(t)
        return {n: statistics.median(v) for n, v in times.items()}

    def watched(self: Any, fns: Any, **k: Any) -> Any:  # the CPU while the bench's protocol times
        if "compile" not in fns:
            return timer_time(self, fns, **k)
        theirs.append(sys._getframe(1).f_locals["variants"]["compile"])
        row: dict[str, Any] = {"names": sorted(fns), "state": process_state(), "micro_us": host_micro(dev),
                               "events_before": events(fns)}
        import torch

        with torch.no_grad():
            row["first_profile"] = _kernels(lambda: first_call(*first_args), dev)
        d0 = _counters()
        c0 = cpu_snapshot()
        got = timer_time(self, fns, **k)
        row["cpu"] = cpu_window(c0, cpu_snapshot())
        row["dynamo_while_timed"] = {n: v - d0.get(n, 0) for n, v in _counters().items() if v != d0.get(n, 0)}
        row["medians_us"] = {n: s.median for n, s in got[0].items()}
        row["events_after"] = events(fns)
        timed.append(row)
        if args.undo_steps:  # what, taken away, gives the compiled forward its speed back (the bench stops here)
            import gc

            loc = sys._getframe(1).f_locals
            undo = [("inside the bench", None), ("the garbage collector unfrozen", gc.unfreeze),
                    ("eager + forge undone", loc["applied"].undo),
                    ("torch.compile + forge undone", loc["compiled_applied"].undo),
                    ("the variants dropped", lambda: (loc["variants"].clear(), fns.clear(), gc.collect())),
                    ("the allocator's cache emptied", torch.cuda.empty_cache)]
            row["undo_steps"] = []
            eager_fn = fns["eager"]
            for tag, act in undo:
                if act is not None:
                    act()
                got_e = events({"eager": eager_fn, **({"compile": fns["compile"]} if "compile" in fns else {})})
                row["undo_steps"].append({"tag": tag, "median_us": got_e, "micro_us": host_micro(dev)})
                print(f"  {tag:40s} " + ", ".join(f"{n} {v:.0f}" for n, v in got_e.items()), flush=True)
                print(f"  {'':40s} {row['undo_steps'][-1]['micro_us']}", flush=True)
            import threading

            box: dict[str, Any] = {}
            worker = threading.Thread(target=lambda: box.update(events({"eager": eager_fn})))
            worker.start()
            worker.join()
            row["undo_steps"].append({"tag": "in a new thread", "median_us": box})
            print(f"  {'in a new thread':40s} " + ", ".join(f"{n} {v:.0f}" for n, v in box.items()), flush=True)
            raise RuntimeError("compile_in_bench --undo-steps: the bench stopped after its probes")
        return got

    Timer.time = watched  # type: ignore[method-assign]

    def bench(*a: Any, **k: Any) -> Any:
        if not k.get("with_compile"):
            return orig(*a, **k)
        rows.append(probe("before the bench's four-way bench", spec, dev, args.reps, {"compiled first": first})[0])
        return orig(*a, **k)

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
        Timer.time = timer_time  # type: ignore[method-assign]
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
    for r in rows:
        print(f"cpu while {r['tag']} timed: {r['cpu']}")
    if not any(t.get("undo_steps") for t in timed):
        print(f"host µs a call, after the bench: {host_micro(dev)}")
    for r in rows + [{"tag": "inside the bench, before its timing", **t} for t in timed]:
        print(f"host µs a call, {r['tag']}: {r['micro_us']}")
    prof = [(r["tag"], r["profile"]) for r in rows] + [("the first compile, inside the bench", t["first_profile"])
                                                         for t in timed]
    for tag, p in prof:
        print(f"host self time in one profiled forward, {tag}: {p['host_self_us']:.0f} µs; "
              + "; ".join(f"{n} x{k} {v:.0f}" for n, k, v in p["host_top"][:8]))
    for t in timed:
        print(f"the bench timed {', '.join(f'{n} {v:.0f}' for n, v in t['medians_us'].items())}; cpu {t['cpu']}")
        for when in ("events_before", "events_after"):
            print(f"  {when}: {', '.join(f'{n} {v:.0f}' for n, v in t[when].items())}")
        print(f"  Dynamo while timed: {t['dynamo_while_timed']}")
        print(f"  state: {t['state']}")
    print(f"state after: {process_state()}")
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
            {"rows": rows, "bench_timings": timed, "bench_record": rec.data}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
