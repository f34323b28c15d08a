"""Answers: does the fold's one-pass epilogue (bias, residual and ReLU in one kernel,
forge_tui/runtime/epilogue.py) pay in ResNet-50's op-by-op forward on the H200, where the host
binds, as it does in CUDA graphs, and does launching it through ctypes (the native kernel,
epilogue.cu) rather than Triton's Python launcher change that? One process, one workspace folded
by `forge fold`'s code, the forwards timed interleaved: eager, folds with the native epilogue,
with the Triton one, without any (a pair's own convolution with its bias, then the forward's own
ReLU and sum), and each in CUDA graphs beside eager's. "host ms" is the time until the forward
returns, before the device is waited for.

    python bench/lab/fold_epilogue_ab.py [--reps 40]

Prints a table; JSON to $OUT if set.

Answer on the H200 (2026-12-02, 40 reps, docs/runs/data/2026-12-02-s11/call5-*), before the native
kernel: op by op, eager 4.82 ms, folds with the Triton epilogue 1.121x [1.089, 1.143], without it
1.289x [1.249, 1.305]; in CUDA graphs, eager 3.65 ms, with it 1.454x [1.453, 1.456], without it
1.100x. The Triton launch costs the host more than the ops it replaces.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from forge_tui.folding import fold_workload  # noqa: E402
from forge_tui.runtime import epilogue  # noqa: E402
from forge_tui.runtime import fold as fold_mod  # noqa: E402
from forge_tui.runtime.apply import Mode, apply  # noqa: E402
from forge_tui.workload import load_workload  # noqa: E402
from forge_tui.workspace import profile_into_workspace  # noqa: E402


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fold-ab-"))
    cfg = tmp / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\n")
    ws, _ = profile_into_workspace("example:resnet50", tmp / "ws", device="cuda", config_path=cfg)
    cards, _, entries = fold_workload("example:resnet50", ws, device="cuda")
    print(f"{len(entries)} fold cards, {sum(len(e.signature.module_paths) for e in entries)} batch norms")
    wl = load_workload("example:resnet50")
    model, inputs = wl.build("cuda")
    model.eval()
    real = fold_mod.rewrite

    native = epilogue.native()
    print(f"native epilogue: {'built' if native else 'not had: ' + epilogue.native_why()}")

    def served(mode: Mode, epilogues: bool):
        """A copy of the model with the folds, the epilogues forced on or off."""
        m = copy.deepcopy(model)
        fold_mod.rewrite = lambda parent, graph, folds, _e=False: real(parent, graph, folds, epilogues)
        try:
            apply(m, ws, mode=mode, trial_calls=0)
        finally:
            fold_mod.rewrite = real
        return m

    def triton_only(fn):
        """``fn`` with the native kernel hidden: the epilogue takes Triton's path."""
        def run():
            epilogue._NATIVE = False
            try:
                return fn()
            finally:
                epilogue._NATIVE = native or False
        return run

    with_epi, without = served(Mode.INFERENCE, True), served(Mode.INFERENCE, False)
    g_with, g_without = served(Mode.CUDA_GRAPH, True), served(Mode.CUDA_GRAPH, False)
    x = inputs[0]
    with torch.no_grad():
        ref = model(x).float()
        fns = {"eager": lambda: model(x), "folds, no epilogue": lambda: without(x),
               "folds + Triton epilogue": triton_only(lambda: with_epi(x))}
        if native:
            fns["folds + native epilogue"] = lambda: with_epi(x)
        errs = {k: float((f().float() - ref).abs().max() / ref.abs().max()) for k, f in fns.items()}
        fns["graphs: eager"] = graphed(lambda: model(x))
        fns["graphs: folds, no epilogue"] = graphed(lambda: g_without(x))
        fns["graphs: folds + Triton epilogue"] = triton_only(lambda: graphed(lambda: g_with(x)))()
        if native:
            fns["graphs: folds + native epilogue"] = graphed(lambda: g_with(x))
        times: dict = {k: [] for k in fns}
        host: dict = {k: [] for k in fns}
        for _ in range(3):
            for f in fns.values():
                f()
        for _ in range(args.reps):
            for k, f in fns.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                f()
                h = time.perf_counter()
                torch.cuda.synchronize()
                times[k].append((time.perf_counter() - t) * 1e3)
                host[k].append((h - t) * 1e3)
    rows = []
    print(f"{'variant':32} {'median ms':>10} {'host ms':>8} {'x eager (paired) [q1, q3]':>28} {'rel diff':>9}")
    for k, ts in times.items():
        base = times["graphs: eager" if k.startswith("graphs") else "eager"]
        r = [b / t for b, t in zip(base, ts)]
        q = statistics.quantiles(r, n=4)
        rows.append({"variant": k, "median_ms": statistics.median(ts), "host_ms": statistics.median(host[k]),
                     "x": statistics.median(r), "q1": q[0], "q3": q[2], "rel_diff": errs.get(k)})
        print(f"{k:32} {statistics.median(ts):10.3f} {statistics.median(host[k]):8.3f} {statistics.median(r):12.3f}x "
              f"[{q[0]:.3f}, {q[2]:.3f}] {errs[k] if k in errs else float('nan'):9.2e}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fold_epilogue_ab.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps,
             "native": bool(native), "native_why": epilogue.native_why(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
