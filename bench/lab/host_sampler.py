"""Asks: where does the host spend the time that eager + forge's forward costs it beyond eager's?
The timeline (inplace_timeline.py) times modules with hooks, which change what they time, and the
profiler's per-op self times leave out the Python between ops. This samples the process instead:
py-spy, with native frames, over forwards run back to back (each ended by a synchronize), eager and
eager + forge alternately, in fresh processes; then each frame's share of the samples taken inside
the timed loop, turned into µs per forward by the loop's own wall time.

    python bench/e2e_bench.py diffusion --keep-workspace /tmp/ws-diffusion ...   # a workspace
    python bench/lab/host_sampler.py diffusion /tmp/ws-diffusion [--seconds 15] [--rate 200] [--rounds 2]

Needs py-spy (a wheel in .whl for the device). Prints, per variant, µs a forward: the loop, the
wait for the device, the host's busy time; then the frames (inclusive, and native self time) with
the largest differences, and forge's own runtime frames. JSON to $OUT if set.

Answer (H200 machine, 2026-12-04, docs/runs/issue-15-17-h200.md): native unwinding slows the sampled
forwards 2-6x, and deeper stacks (forge's, Dynamo's) more, so the µs are shares of a distorted run,
not times; compare frames within one variant. What it found on the diffusion: the compiled
`vae_attn` scope cost the host about three times eager's attention; the workspace kernels' general
path (`CardKernel.__call__`: the device's string as the workspace key, ctypes' conversion) stood out
among forge's frames (since `36f0923` they take the bound path); and a VAE merge promoted within
its spread had put the attention under the interceptor (since `85445e0` refused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOOP = "_timed_loop"
WAIT = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cuCtxSynchronize", "cuStreamSynchronize",
        "synchronize (torch/cuda/__init__.py")
FRAME = re.compile(r"^(?P<fn>.*?) \((?P<where>[^()]*)\)$")


def _timed_loop(run: Any, sync: Any, seconds: float) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run()
        sync()
        n += 1
    return n, time.perf_counter() - t0


def child(workload: str, workspace: str, variant: str, seconds: float, device: str, result: str) -> int:
    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload
    from forge_tui.workspace import Workspace

    wl = load_workload(workload if workload.endswith(".py") or ":" in workload else f"example:{workload}")
    model, inputs = wl.build(device)
    model.eval()
    applied = None
    if variant == "eager+forge":  # as forge bench applies them: no in-place trial
        applied = apply(model, Workspace.open(Path(workspace)), device=device, trial_calls=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(30):
            wl.run(model, inputs)
        sync()
        n, wall = _timed_loop(lambda: wl.run(model, inputs), sync, seconds)
    status = {}
    if applied is not None:
        status = {c["card"]: {"served": c["served"], "fallbacks": dict(c["fallbacks"]), "dispatch_us": c.get("dispatch_us"),
                              "active": c.get("active", True)} for c in applied.status()["cards"]}
    Path(result).write_text(json.dumps({"forwards": n, "wall_s": wall, "status": status}))
    return 0


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def _short(frame: str, line: bool = False) -> str:
    """The frame without its process's addresses and, unless ``line``, without its line number:
    the same function in two processes, one key."""
    m = FRAME.match(frame)
    if not m:
        return frame
    fn, where = m["fn"], m["where"]
    for cut in ("site-packages/", str(ROOT) + "/"):
        if cut in where:
            where = where.split(cut, 1)[1]
    if fn.startswith("0x"):
        fn = "?"
    if not line:
        where = re.sub(r":\d+$", "", where)
    return f"{fn} ({where})"


def analyse(raw: str, forwards: int, wall_s: float) -> dict[str, Any]:
    """Samples inside the timed loop, as µs per forward: the loop's wall time shared out by the
    samples' counts (the main thread's; the others are listed apart)."""
    inclusive: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    total = wait = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = _frames(stack)
        if not any(LOOP in f for f in frames):
            continue
        c = int(count)
        total += c
        inner = frames[next(i for i, f in enumerate(frames) if LOOP in f) + 1:]
        if any(any(w in f for w in WAIT) for f in inner):
            wait += c
        for f in set(map(_short, inner)):
            inclusive[f] += c
        for f in {_short(f, line=True) for f in inner if "forge_tui/" in f or "torch/nn/modules/module.py" in f}:
            lines[f] += c
        if inner:
            self_[_short(inner[-1])] += c
    per = (wall_s / max(forwards, 1)) * 1e6 / max(total, 1)  # µs per forward per sample
    return {"samples": total, "forward_us": wall_s / max(forwards, 1) * 1e6, "wait_us": wait * per,
            "busy_us": (total - wait) * per,
            "inclusive": {k: v * per for k, v in inclusive.items()}, "self": {k: v * per for k, v in self_.items()},
            "lines": {k: v * per for k, v in lines.items()}}


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("forward_us", "wait_us", "busy_us"):
        out[key] = sum(r[key] for r in runs) / len(runs)
        out[key + "_each"] = [round(r[key], 1) for r in runs]
    for key in ("inclusive", "self", "lines"):
        acc: Counter[str] = Counter()
        for r in runs:
            for k, v in r[key].items():
                acc[k] += v / len(runs)
        out[key] = dict(acc)
    return out


def _diff(a: dict[str, float], b: dict[str, float], top: int) -> list[tuple[str, float, float]]:
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0)) for k in set(a) | set(b)]
    return sorted(rows, key=lambda r: -abs(r[2] - r[1]))[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload")
    ap.add_argument("workspace")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.workload, args.workspace, args.child[0], args.seconds, args.device, args.child[1])
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    site_bin = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p and Path(p, "bin", "py-spy").exists()]
    if site_bin:
        spy = str(Path(site_bin[0], "bin", "py-spy"))
    out_dir = Path(os.environ.get("OUT") or "/tmp")
    raw_dir = Path("/tmp/host_sampler")  # the raw samples stay on the machine: a few MB each
    raw_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_variant: dict[str, list[dict[str, Any]]] = {"eager": [], "eager+forge": []}
    status: dict[str, Any] = {}
    for r in range(args.rounds):
        for variant in ("eager", "eager+forge"):
            tag = f"{variant.replace('+', '_')}-{r}"
            raw, res = raw_dir / f"{tag}.txt", raw_dir / f"{tag}.json"
            cmd = [spy, "record", "--native", "-r", str(args.rate), "--format", "raw", "-o", str(raw), "--",
                   sys.executable, __file__, args.workload, args.workspace, "--seconds", str(args.seconds),
                   "--device", args.device, "--child", variant, str(res)]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds * 6 + 240)
            if p.returncode != 0 or not raw.exists() or not res.exists():
                print(f"{tag}: py-spy or the child failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
                return 1
            got = json.loads(res.read_text())
            a = analyse(raw.read_text(), got["forwards"], got["wall_s"])
            per_variant[variant].append(a)
            status = got["status"] or status
            print(f"{tag}: {got['forwards']} forwards, {a['forward_us']:.0f} µs each, {a['samples']} samples in the loop, "
                  f"{time.time() - t0:.0f} s", flush=True)
    e, f = _merge(per_variant["eager"]), _merge(per_variant["eager+forge"])
    print(f"\n{'µs a forward':28s} {'eager':>9s} {'forge':>9s} {'diff':>8s}")
    for key, name in (("forward_us", "the forward (wall)"), ("busy_us", "host busy"), ("wait_us", "waiting for the device")):
        print(f"{name:28s} {e[key]:9.1f} {f[key]:9.1f} {f[key] - e[key]:+8.1f}   each: {e[key + '_each']} | {f[key + '_each']}")
    print("\ninclusive, the largest differences (µs a forward, eager | forge):")
    for k, a, b in _diff(e["inclusive"], f["inclusive"], args.top):
        print(f"  {a:8.1f} | {b:8.1f}  {b - a:+8.1f}  {k[:150]}")
    print("\nself time (the innermost frame), the largest differences:")
    for k, a, b in _diff(e["self"], f["self"], args.top):
        print(f"  {a:8.1f} | {b:8.1f}  {b - a:+8.1f}  {k[:150]}")
    print("\nby line, forge's and nn.Module's frames, the largest differences:")
    for k, a, b in _diff(e["lines"], f["lines"], args.top):
        print(f"  {a:8.1f} | {b:8.1f}  {b - a:+8.1f}  {k[:150]}")
    ours = sorted(((k, v) for k, v in f["lines"].items() if "forge_tui/runtime" in k), key=lambda kv: -kv[1])[:args.top]
    print("\nforge's runtime in eager + forge, by line, inclusive:")
    for k, v in ours:
        print(f"  {v:8.1f}  {k[:150]}")
    print("\ncards:", json.dumps(status))
    report = {"eager": e, "eager+forge": f, "status": status, "rate": args.rate, "seconds": args.seconds}
    for v in (e, f):  # keep the JSON readable: the frames above 2 µs a forward
        for key in ("inclusive", "self", "lines"):
            v[key] = {k: round(x, 2) for k, x in v[key].items() if x >= 2}
    (out_dir / "host_sampler.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
