"""Where does eager + forge lose the bound that the served cards' isolated speedups imply: the host
not keeping the GPU fed (the GPU idles between kernels), our kernels running slower in the model
than alone, or the profile's shares overstating what the cards cost in the model?

``e2e_bench.py --timeline`` calls it for each workload (its JSON goes in the workload's record,
"host_by_module" and "timeline"); it also runs on its own against a workspace the bench kept:

    python bench/e2e_bench.py diffusion --timeline                  # after the bench, on cuda
    python bench/e2e_bench.py diffusion --keep-workspace /tmp/kept  # then:
    python bench/e2e_timeline.py diffusion /tmp/kept/diffusion [--forwards 10]

* ``modules_host``: the host's time for one call of each module forge replaced, eager's and forge's,
  every promoted kernel served.
* ``timeline``: the workload's forward under torch.profiler, eager and with the workspace's promoted
  kernels applied (as ``forge bench`` applies them, without the in-place trial): per forward the wall
  time, the GPU's busy time (the union of its kernels' intervals), the sum of kernel times, and the
  kernels that differ between the two (eager's that forge removed, forge's that it added) with their
  times in place; without the profiler, the host's time until the forward returns and the wall time;
  and, leaf by leaf inside the forward (``leaves_in_forward``), where the host's time goes.

What it found is summed up in docs/runtime.md ("forge bench") and measured in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _profile(run: Any, forwards: int, device: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(forwards):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e6 / forwards
    kernels: dict[str, list[float]] = defaultdict(list)
    intervals = []
    for e in prof.events():
        if device == "cuda" and str(e.device_type).endswith("CUDA"):
            a, b = e.time_range.start, e.time_range.end
            intervals.append((a, b))
            kernels[e.name].append(b - a)
    summed = sum(sum(v) for v in kernels.values())
    # the host's side by name (aten ops and the CUDA runtime's calls): self time a forward
    cpu_ops = {e.key: {"calls": e.count / forwards, "self_us": e.self_cpu_time_total / forwards}
               for e in prof.key_averages() if e.self_cpu_time_total > 0}
    return {"wall_us": wall, "busy_us": _busy_us(intervals) / forwards, "kernel_sum_us": summed / forwards,
            "kernels": {k: {"calls": len(v) / forwards, "us": sum(v) / forwards} for k, v in kernels.items()},
            "cpu_ops": cpu_ops}


def _host(run: Any, forwards: int, device: str) -> dict[str, float]:
    """Without the profiler: per forward, the host's time until the forward returns (the device
    idle at its start; the launches queue up, so this is the host's own work while the queue has
    room) and the wall time until the device is done. Medians."""
    import statistics

    import torch

    host, wall = [], []
    for _ in range(forwards):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        if device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    return {"host_us": statistics.median(host), "wall_us": statistics.median(wall)}


def leaves_in_forward(model: Any, forged: Any, run: Any, device: str, forwards: int = 20) -> dict[str, Any]:
    """The host's time inside one forward, eager's and forge's, interleaved, without the profiler:
    per leaf module (summed over its calls in a forward, from its forward pre-hook to its forward
    hook) and the rest of the forward (the parents' Python, the functional ops between modules).
    The device synchronised before each forward and not waited for inside it, so a leaf whose
    time grows where forge serves something else shows the host waiting (a full launch queue, a
    synchronising call) or a slower path taken after a served call. Medians over ``forwards``."""
    import statistics

    import torch

    def instrument(m: Any) -> tuple[dict[str, int], dict[str, str], list[Any]]:
        acc: dict[str, int] = defaultdict(int)
        kinds: dict[str, str] = {}
        start: dict[str, int] = {}
        hooks = []
        for name, mod in m.named_modules():
            if next(mod.children(), None) is not None:
                continue
            kinds[name] = type(mod).__name__

            # never traced: called inside one of forge's compiled scopes, Dynamo would trace these
            # hooks, guard on the clock's readings and recompile them on every call
            @torch.compiler.disable
            def pre(_m: Any, _a: Any, name: str = name) -> None:
                start[name] = time.perf_counter_ns()

            @torch.compiler.disable
            def post(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
                acc[name] += time.perf_counter_ns() - start.pop(name)

            hooks += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        return acc, kinds, hooks

    samples: dict[str, dict[str, list[float]]] = {"eager": defaultdict(list), "eager+forge": defaultdict(list)}
    kinds: dict[str, str] = {}
    hooks: list[Any] = []
    accs = {}
    for v, m in (("eager", model), ("eager+forge", forged)):
        accs[v], k, h = instrument(m)
        kinds.update(k)
        hooks += h
    try:
        with torch.no_grad():
            for _ in range(forwards):
                for v, m in (("eager", model), ("eager+forge", forged)):
                    acc = accs[v]
                    acc.clear()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter_ns()
                    run(m)
                    total = time.perf_counter_ns() - t0
                    for path, ns in acc.items():
                        samples[v][path].append(ns / 1000.0)
                    samples[v]["<total>"].append(total / 1000.0)
                    samples[v]["<rest>"].append((total - sum(acc.values())) / 1000.0)
    finally:
        for h in hooks:
            h.remove()
    med = {v: {p: statistics.median(x) for p, x in d.items()} for v, d in samples.items()}
    e, f = med["eager"], med["eager+forge"]
    paths = sorted(set(e) | set(f))
    rows = [{"module": p, "kind": kinds.get(p, p), "eager_us": round(e.get(p, 0.0), 2),
             "forge_us": round(f.get(p, 0.0), 2), "added_us": round(f.get(p, 0.0) - e.get(p, 0.0), 2)} for p in paths]
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"eager_us": 0.0, "forge_us": 0.0, "modules": 0})
    for r in rows:
        if r["module"].startswith("<"):
            continue
        k = by_kind[r["kind"]]
        k["eager_us"] += r["eager_us"]
        k["forge_us"] += r["forge_us"]
        k["modules"] += 1
    return {"forwards": forwards, "total": {v: med[v]["<total>"] for v in med},
            "rest": {v: med[v]["<rest>"] for v in med},
            "by_kind": {k: {kk: round(vv, 2) for kk, vv in d.items()} for k, d in by_kind.items()},
            "modules": sorted(rows, key=lambda r: -abs(r["added_us"]))[:40]}


def describe_leaves(t: dict[str, Any], top: int = 12) -> list[str]:
    tot, rest = t["total"], t["rest"]
    lines = [f"host inside the forward, eager | forge (median of {t['forwards']} interleaved, µs): total "
             f"{tot['eager']:.0f} | {tot['eager+forge']:.0f}; outside leaf modules {rest['eager']:.0f} | "
             f"{rest['eager+forge']:.0f}"]
    for k, d in sorted(t["by_kind"].items(), key=lambda kv: -abs(kv[1]["forge_us"] - kv[1]["eager_us"])):
        lines.append(f"  {k[:28]:28s} x{int(d['modules']):<4d} {d['eager_us']:9.1f} | {d['forge_us']:9.1f} "
                     f"{d['forge_us'] - d['eager_us']:+9.1f}")
    lines.append("  by module, the largest differences:")
    for r in [r for r in t["modules"] if not r["module"].startswith("<")][:top]:
        lines.append(f"  {r['module'][:36]:36s} {r['kind'][:14]:14s} {r['eager_us']:8.1f} | {r['forge_us']:8.1f} "
                     f"{r['added_us']:+8.1f}")
    return lines


def host_by_module(model: Any, forged: Any, applied: Any, run: Any, device: str, calls: int = 5,
                   rounds: int = 7) -> list[dict[str, Any]]:
    """Per module whose forward forge replaced (a module card, an op card's scope, a child run
    outside its parent's scope): the host's time for one call of it, eager's module and forge's,
    on the arguments one forward passes it (``calls`` back to back, the device synchronised before
    each round and not waited for after; the best of ``rounds``, interleaved). A module's time
    includes its children's; ``self_added_us`` leaves out what the listed modules below it add.
    Sorted by what forge adds a forward on its own (the difference times its calls in a forward,
    less its children's)."""
    import torch

    names = {id(m): n for n, m in forged.named_modules()}
    paths = sorted({names[id(m)] for m in applied.forwards.modules() if id(m) in names})
    seen: dict[str, Any] = {}
    count: dict[str, int] = defaultdict(int)

    def catch(path: str) -> Any:
        @torch.compiler.disable  # never traced inside a compiled scope (see leaves_in_forward)
        def hook(mod: Any, args: Any, kwargs: Any) -> None:
            seen.setdefault(path, (args, kwargs))
            count[path] += 1

        return hook

    hooks = [(forged.get_submodule(p) if p else forged).register_forward_pre_hook(catch(p), with_kwargs=True)
             for p in paths]
    try:
        with torch.no_grad():
            run(forged)
    finally:
        for h in hooks:
            h.remove()

    def once(m: Any, args: Any, kwargs: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            m(*args, **kwargs)
        return (time.perf_counter_ns() - t0) / calls / 1000.0

    rows = []
    with torch.no_grad():
        for p in paths:
            if p not in seen:
                continue
            args, kwargs = seen[p]
            me, mf = (model.get_submodule(p) if p else model), (forged.get_submodule(p) if p else forged)
            best = {"eager": float("inf"), "forge": float("inf")}
            try:
                for _ in range(rounds):
                    best["eager"] = min(best["eager"], once(me, args, kwargs))
                    best["forge"] = min(best["forge"], once(mf, args, kwargs))
            except Exception as exc:  # noqa: BLE001 - a module that cannot be called alone: say so
                rows.append({"module": p, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            rows.append({"module": p or "<model>", "calls": count[p], "eager_us": round(best["eager"], 2),
                         "forge_us": round(best["forge"], 2),
                         "added_us": round((best["forge"] - best["eager"]) * count[p], 2)})
    timed = {r["module"]: r for r in rows if "added_us" in r}
    for r in timed.values():
        r["self_added_us"] = r["added_us"]
    for path, r in timed.items():
        parts = path.split(".") if path != "<model>" else []
        parent = next((".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1) if ".".join(parts[:k]) in timed),
                      "<model>" if parts else None)
        if parent in timed:
            timed[parent]["self_added_us"] = round(timed[parent]["self_added_us"] - r["added_us"], 2)
    return sorted(rows, key=lambda r: -r.get("self_added_us", 0.0))


def modules_host(spec: str, ws: Any, device: str, warmup: int = 8) -> list[dict[str, Any]]:
    """``host_by_module`` with every promoted kernel served (none switched off by the dispatch
    rule, no in-place trial): where serving them costs the host time, module by module."""
    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    wl = load_workload(spec)
    model, inputs = wl.build(device)
    model.eval()
    forged = copy.deepcopy(model)
    applied = apply(forged, ws, device=device, trial_calls=0, only_faster=False)
    try:
        with torch.no_grad():
            for _ in range(warmup):
                wl.run(model, inputs)
                wl.run(forged, inputs)
        return host_by_module(model, forged, applied, lambda m: wl.run(m, inputs), device)
    finally:
        applied.undo()


def describe_modules(rows: list[dict[str, Any]], top: int = 10) -> list[str]:
    rows = [r for r in rows if "added_us" in r]
    if not rows:
        return []
    lines = [f"host a call, eager | forge, by module forge replaced ({len(rows)} modules; a forward: what forge "
             f"adds there, children included, and on its own; the most on its own first):"]
    for r in rows[:top] + ([] if len(rows) <= top + 3 else rows[-3:]):
        lines.append(f"  {r['module'][:36]:36s} x{r['calls']:<3d} {r['eager_us']:8.1f} | {r['forge_us']:8.1f} µs "
                     f"{r['added_us']:+9.1f} {r['self_added_us']:+9.1f} µs")
    return lines


def timeline(spec: str, ws: Any, device: str, forwards: int = 10, warmup: int = 16) -> dict[str, Any]:
    """The two variants' profiles and the kernels that differ between them (per forward, µs)."""
    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    wl = load_workload(spec)
    model, inputs = wl.build(device)
    model.eval()
    forged = copy.deepcopy(model)
    applied = apply(forged, ws, device=device, trial_calls=0)  # as the bench applies them: no in-place trial
    out: dict[str, Any] = {"forwards": forwards}
    try:
        with torch.no_grad():
            for _ in range(warmup):  # caches and allocator warm
                wl.run(model, inputs)
                wl.run(forged, inputs)
            out["eager"] = _profile(lambda: wl.run(model, inputs), forwards, device)
            out["eager+forge"] = _profile(lambda: wl.run(forged, inputs), forwards, device)
            out["host"] = {}
            for _ in range(2):  # interleaved: the host's speed drifts within a machine
                for v, m in (("eager", model), ("eager+forge", forged)):
                    h = _host(lambda m=m: wl.run(m, inputs), forwards, device)
                    out["host"].setdefault(v, []).append(h)
            out["leaves"] = leaves_in_forward(model, forged, lambda m: wl.run(m, inputs), device, 2 * forwards)
            # the bench's protocol (forge_tui.timing: rounds interleaved in a shuffled order, an
            # empty callable among them): does it see what back-to-back forwards do not?
            from forge_tui.timing import Timer, paired_ratio

            # a third variant, a copy of eager's model with nothing applied: what copying alone does
            timer = Timer(device, warmup=3, repeats=2 * forwards, cold_l2=False)
            twin = copy.deepcopy(model)
            st, raw, _ = timer.time({"eager": lambda: wl.run(model, inputs), "eager+forge": lambda: wl.run(forged, inputs),
                                     "eager copy": lambda: wl.run(twin, inputs)})
            out["bench_protocol"] = {"eager_us": st["eager"].median, "forge_us": st["eager+forge"].median,
                                     "copy_us": st["eager copy"].median,
                                     "ratio": paired_ratio(raw["eager"], raw["eager+forge"]).to_json(),
                                     "copy_ratio": paired_ratio(raw["eager"], raw["eager copy"]).to_json()}
        out["active"] = sorted(c for c, g in applied.guards.items() if g.status.active)
        out["disabled"] = {c: g.status.disabled_reason for c, g in applied.guards.items() if not g.status.active}
        # what the forwards above did with each card: a card served fewer times than it is called
        # a forward fell back (and says why), or was switched off by its dispatch rule
        out["status"] = {c["card"]: {"served": c["served"], "fallbacks": dict(c["fallbacks"]),
                                     "dispatch_us": c.get("dispatch_us")} for c in applied.status()["cards"]}
    finally:
        applied.undo()
    e, f = out["eager"]["kernels"], out["eager+forge"]["kernels"]
    removed = {k: v for k, v in e.items() if k not in f or f[k]["calls"] < v["calls"]}
    added = {k: v for k, v in f.items() if k not in e or e[k]["calls"] < v["calls"]}

    def part(d: dict, other: dict, k: str) -> float:
        v = d[k]
        o = other.get(k)
        if o is None:
            return v["us"]
        # only the calls the other variant does not make, at this variant's mean time a call
        return (v["calls"] - o["calls"]) * v["us"] / max(v["calls"], 1e-9)

    out["removed_us"] = sum(part(e, f, k) for k in removed)
    out["added_us"] = sum(part(f, e, k) for k in added)
    out["removed"] = sorted(((k, round(part(e, f, k), 2)) for k in removed), key=lambda x: -x[1])[:12]
    out["added"] = sorted(((k, round(part(f, e, k), 2)) for k in added), key=lambda x: -x[1])[:12]
    for v in ("eager", "eager+forge"):
        out[v].pop("kernels")  # the differences above are what answers the question
    ce, cf = out["eager"].pop("cpu_ops"), out["eager+forge"].pop("cpu_ops")
    diff = []
    for k in set(ce) | set(cf):
        a, b = ce.get(k, {"calls": 0.0, "self_us": 0.0}), cf.get(k, {"calls": 0.0, "self_us": 0.0})
        diff.append({"name": k, "eager_calls": a["calls"], "forge_calls": b["calls"], "eager_self_us": round(a["self_us"], 2),
                     "forge_self_us": round(b["self_us"], 2), "added_us": round(b["self_us"] - a["self_us"], 2)})
    out["cpu_ops"] = sorted(diff, key=lambda d: -abs(d["added_us"]))[:30]
    return out


def describe(t: dict[str, Any]) -> list[str]:
    e, f = t["eager"], t["eager+forge"]
    lines = [f"{'variant':12s} {'wall µs':>10s} {'GPU busy µs':>12s} {'kernels µs':>11s} {'idle':>6s}"]
    for name, v in (("eager", e), ("eager+forge", f)):
        idle = 1 - v["busy_us"] / v["wall_us"] if v["wall_us"] else 0.0
        lines.append(f"{name:12s} {v['wall_us']:10.1f} {v['busy_us']:12.1f} {v['kernel_sum_us']:11.1f} {100 * idle:5.1f}%")
    for name, runs in (t.get("host") or {}).items():
        lines.append(f"{name:12s} without the profiler: host " + ", ".join(f"{h['host_us']:.0f}" for h in runs)
                     + " µs until the forward returns; wall " + ", ".join(f"{h['wall_us']:.0f}" for h in runs) + " µs")
    lines.append(f"kernels forge removed: {t['removed_us']:.1f} µs a forward; added: {t['added_us']:.1f} µs "
                 f"(in place, GPU time saved {t['removed_us'] - t['added_us']:.1f} µs)")
    for k, us in t["removed"][:6]:
        lines.append(f"  - {us:9.1f} µs  {k[:110]}")
    for k, us in t["added"][:6]:
        lines.append(f"  + {us:9.1f} µs  {k[:110]}")
    for card, why in (t.get("disabled") or {}).items():
        lines.append(f"  disabled before the profile: {card}: {why}")
    if t.get("cpu_ops"):
        lines.append("host self time a forward by name under the profiler, eager | forge (calls; µs), the largest differences:")
        for d in t["cpu_ops"][:12]:
            lines.append(f"  {d['name'][:44]:44s} {d['eager_calls']:6.1f} {d['forge_calls']:6.1f}  {d['eager_self_us']:8.1f} | "
                         f"{d['forge_self_us']:8.1f} {d['added_us']:+8.1f}")
    if t.get("bench_protocol"):
        b = t["bench_protocol"]
        lines.append(f"the bench's protocol (interleaved, shuffled): eager {b['eager_us']:.0f} µs, eager+forge "
                     f"{b['forge_us']:.0f} µs, {b['ratio']['median']:.3f}x [{b['ratio']['q1']:.3f}, {b['ratio']['q3']:.3f}]")
        if "copy_ratio" in b:
            c = b["copy_ratio"]
            lines.append(f"  a copy of eager's model, nothing applied: {b['copy_us']:.0f} µs, {c['median']:.3f}x "
                         f"[{c['q1']:.3f}, {c['q3']:.3f}]")
    if t.get("leaves"):
        lines += describe_leaves(t["leaves"])
    for card, st in (t.get("status") or {}).items():
        fb = ", ".join(f"{n} {why}" for why, n in st["fallbacks"].items()) or "none"
        lines.append(f"  {card}: served {st['served']}, fell back: {fb}"
                     + (f"; dispatch {st['dispatch_us']:.1f} µs" if st.get("dispatch_us") else ""))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload")
    ap.add_argument("workspace")
    ap.add_argument("--forwards", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from forge_tui.workspace import Workspace

    t = timeline(args.workload, Workspace.open(Path(args.workspace)), args.device, args.forwards)
    print("\n".join(describe(t)))
    print(json.dumps(t, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
