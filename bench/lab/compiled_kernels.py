"""Asks: where does torch.compile + forge lose to torch.compile? On the H200 the decoder's compiled
forward ran 0.89-0.92x with forge's kernels as custom ops (2026-12-04), though each of them beat
torch.compile's code for its card in isolation (1.30-5.85x). Either the custom ops cost the host
more than the compiled forward can hide, or inductor's kernels around an opaque node do more work
(a fusion it no longer makes, a copy to the op's strides). This profiles both compiled forwards
and answers with the kernels each runs, by name, per forward: the device time of each, the
kernels one variant runs and the other does not, and each forward's wall and device-busy time.

    python bench/e2e_bench.py decoder --keep-workspace /tmp/kept ...   # a workspace
    python bench/lab/compiled_kernels.py decoder /tmp/kept/decoder [--device cuda] [--forwards 20]

Builds the two variants as ``forge bench`` does (``e2e.bench``: the module cards as custom ops,
the apply's backend serving op and chain cards, then inductor), every kernel on. On a machine
without CUDA it lists the profiler's CPU ops instead of kernels (what the tests can run). Prints a
table; JSON to $OUT if set.

Answer: none yet (written on 2026-12-05, when no device was lent).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


def kernels_per_forward(run: Any, device: str, forwards: int) -> tuple[dict[str, tuple[float, float]], float]:
    """Per kernel name (per CPU op name off CUDA): calls and µs of device time per forward, and
    the forwards' median wall µs, from ``forwards`` profiled forwards after a warm-up."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(5):
        run()
    sync()
    walls = []
    for _ in range(forwards):
        t0 = time.perf_counter_ns()
        run()
        sync()
        walls.append((time.perf_counter_ns() - t0) / 1000.0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(forwards):
            run()
        sync()
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for ev in prof.events():
        on_device = ev.device_type == torch.autograd.DeviceType.CUDA
        if device == "cuda" and not on_device:
            continue
        if device != "cuda" and (on_device or not ev.name.startswith(("aten::", "forge::"))):
            continue
        us = ev.time_range.elapsed_us()  # a kernel's span on the device, or a CPU op's
        per[ev.name][0] += 1
        per[ev.name][1] += us
    return {n: (c / forwards, us / forwards) for n, (c, us) in per.items()}, statistics.median(walls)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", help="a bundled example's name or a workload file")
    p.add_argument("workspace", help="a workspace with promoted kernels (e2e_bench.py --keep-workspace)")
    p.add_argument("--device", default=None, help="cuda where available, else cpu")
    p.add_argument("--forwards", type=int, default=20)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--top", type=int, default=25, help="kernels listed, by the size of their difference")
    a = p.parse_args()
    import torch

    from forge_tui.runtime.apply import Mode, apply
    from forge_tui.workload import load_workload
    from forge_tui.workspace import Workspace

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = a.workload if a.workload.endswith(".py") or ":" in a.workload else f"example:{a.workload}"
    wl = load_workload(spec)
    model, inputs = wl.build(device)
    model.eval()
    ws = Workspace.open(Path(a.workspace))
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    walls: dict[str, float] = {}
    status: list[dict[str, Any]] = []
    with torch.no_grad():
        plain = torch.compile(copy.deepcopy(model), backend=a.backend)
        rows["compile"], walls["compile"] = kernels_per_forward(lambda: wl.run(plain, inputs), device, a.forwards)
        plain = None  # freed before the other variant compiles
        torch._dynamo.reset()
        cf = copy.deepcopy(model)
        applied = apply(cf, ws, mode=Mode.TORCH_COMPILE, device=device, only_faster=False)
        with applied:
            forged = torch.compile(cf, backend=applied.backend(a.backend))
            rows["compile+forge"], walls["compile+forge"] = kernels_per_forward(lambda: wl.run(forged, inputs), device,
                                                                                a.forwards)
            status = [{k: c[k] for k in ("card", "active", "served", "disabled_reason", "traced_fallbacks")}
                      for c in applied.status()["cards"]]
    names = set(rows["compile"]) | set(rows["compile+forge"])
    table = []
    for n in names:
        c0, us0 = rows["compile"].get(n, (0.0, 0.0))
        c1, us1 = rows["compile+forge"].get(n, (0.0, 0.0))
        table.append({"kernel": n, "compile_calls": c0, "compile_us": us0, "forge_calls": c1, "forge_us": us1,
                      "diff_us": us1 - us0})
    table.sort(key=lambda r: -abs(r["diff_us"]))
    busy = {v: sum(us for _, us in rows[v].values()) for v in rows}
    count = {v: sum(c for c, _ in rows[v].values()) for v in rows}
    what = "kernels" if device == "cuda" else "CPU ops (self and children; no CUDA here)"
    print(f"{a.workload} on {device}, {a.forwards} profiled forwards a variant, {what} per forward")
    for v in rows:
        print(f"  {v:14s} wall {walls[v]:10.1f} µs   {what.split()[0]} {count[v]:7.1f}   their time {busy[v]:10.1f} µs")
    print(f"\n  {'calls':>6s} {'µs':>9s} | {'calls':>6s} {'µs':>9s} | {'diff µs':>9s}  kernel (compile | compile+forge)")
    for r in table[:a.top]:
        print(f"  {r['compile_calls']:6.1f} {r['compile_us']:9.1f} | {r['forge_calls']:6.1f} {r['forge_us']:9.1f} | "
              f"{r['diff_us']:9.1f}  {r['kernel'][:110]}")
    print("\n  cards: " + "; ".join(f"{s['card']} served {s['served']}" + ("" if s["active"] else
                                   f" (off: {s['disabled_reason']})") for s in status))
    out = os.environ.get("OUT")
    if out:
        Path(out, "compiled_kernels.json").write_text(json.dumps(
            {"workload": a.workload, "device": device, "torch": torch.__version__, "forwards": a.forwards,
             "wall_us": walls, "busy_us": busy, "count": count, "kernels": table, "cards": status}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
