"""Asks: on the H100 (2026-12-06, thirteenth session, call 2) ResNet-50's torch.compile + forge
forward ran 1.493x torch.compile's (2.55 ms against 3.78), where the two kernels served in its
compiled graph (the final mean, the max pool) bound the gain at 1.001x. Once forge's backend finds
a card in a graph it takes another path to inductor: ``aot_autograd``, forge's rewrite of the ATen
graph, then inductor on that graph (``runtime.graph.CompileBackend``); with no card found the graph
goes to inductor as Dynamo traced it. Is the path alone what runs faster? Times, interleaved, by
CUDA events (or the host's clock on the CPU): eager; ``torch.compile(model)``; ``torch.compile``
through forge's path with nothing rewritten (the same ``aot_autograd`` and inductor calls, an empty
rewrite); and, where ``--workspace`` is given, the bench's own torch.compile + forge.

    python bench/lab/compile_paths.py [resnet50] [--device cuda] [--reps 30] [--workspace WS]
        [--before nothing|profile|inference]

Prints a table; JSON to $OUT if set.

Answer (H100, 2026-12-06, thirteenth session, calls 3-5, data/2026-12-06-s13): the path is not
it. ResNet-50: torch.compile 2134 µs, through forge's path 2135 (1.000x); the decoder 11099 and
11036 (1.006x). What differs is the bench's process: there torch.compile's ResNet-50 forward ran
3145-3777 µs (1.14-1.38x eager), here 2094-2335 (1.86-2.07x eager); with the bench's own
workspace (call 4, ``--workspace``) torch.compile + forge ran 2247 µs against torch.compile's 2095
(0.932x) in this process, where the bench had measured 1.299x. Profiling the workload first
(``--before profile``, call 5, a noisier host) left the ratio to eager as it was (0.554 against
0.538 without). What slows the bench's torch.compile variant is not known yet; until it is, the
bench's torch.compile figures for ResNet-50 are not to be trusted.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def forge_path(inner: str = "inductor") -> Any:
    """A torch.compile backend that sends every graph the way forge's backend sends one in which
    it found a card (``CompileBackend.__call__``), with nothing rewritten."""
    import torch._guards
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.registry import lookup_backend
    from torch._functorch.aot_autograd import make_boxed_func
    from torch.fx.graph import CodeGen

    def inference(agm: Any, inputs: Any) -> Any:
        agm.graph.set_codegen(CodeGen())
        agm.recompile()
        with torch._guards.tracing(None):
            compiled = lookup_backend(inner)(agm, list(inputs))
        return make_boxed_func(compiled)

    def training(agm: Any, inputs: Any) -> Any:
        return make_boxed_func(agm.forward)

    return aot_autograd(fw_compiler=training, inference_compiler=inference)


def main() -> int:
    import torch

    from forge_tui.workload import load_workload

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default="resnet50")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--workspace", help="a workspace with promoted kernels: the bench's torch.compile + forge too")
    ap.add_argument("--before", choices=["nothing", "profile", "inference"], default="nothing",
                    help="what this process does first, as the e2e bench's does before it compiles: profile the "
                         "workload (forge's profiler), or apply --workspace's kernels to a copy op by op and run it")
    args = ap.parse_args()
    dev = args.device
    spec = args.workload if args.workload.endswith(".py") else f"example:{args.workload}"
    wl = load_workload(spec)
    if args.before == "profile":
        import tempfile

        from forge_tui.workspace import profile_into_workspace

        profile_into_workspace(spec, Path(tempfile.mkdtemp()) / "ws", device=dev)
    model, inputs = wl.build(dev, None)
    model.eval()
    variants: dict[str, Any] = {"eager": model,
                                "compile": torch.compile(copy.deepcopy(model)),
                                "compile, forge's path": torch.compile(copy.deepcopy(model), backend=forge_path())}
    if args.before == "inference":
        from forge_tui.runtime.apply import Mode, apply

        if not args.workspace:
            ap.error("--before inference needs --workspace")
        fm = copy.deepcopy(model)
        apply(fm, args.workspace, mode=Mode.INFERENCE, device=dev, trial_calls=0)
        with torch.no_grad():
            wl.run(fm, inputs)
    if args.workspace:
        from forge_tui.runtime.apply import Mode, apply

        cf = copy.deepcopy(model)
        applied = apply(cf, args.workspace, mode=Mode.TORCH_COMPILE, device=dev)
        variants["compile + forge"] = torch.compile(cf, backend=applied.backend("inductor"))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def once(m: Any) -> float:
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            wl.run(m, inputs)
            b.record()
            sync()
            return a.elapsed_time(b) * 1000.0
        import time

        t0 = time.perf_counter()
        wl.run(m, inputs)
        return (time.perf_counter() - t0) * 1e6

    times: dict[str, list[float]] = {n: [] for n in variants}
    ref = None
    agree: dict[str, float] = {}
    with torch.no_grad():
        for name, m in variants.items():  # compile and warm each
            for _ in range(3):
                out = wl.run(m, inputs)
            sync()
            flat = out if isinstance(out, torch.Tensor) else out[0]
            if ref is None:
                ref = flat.float()
            agree[name] = float((flat.float() - ref).abs().max())
        for _ in range(args.reps):
            for name, m in variants.items():
                times[name].append(once(m))
    med = {n: statistics.median(v) for n, v in times.items()}
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"{args.workload} on {name}, torch {torch.__version__}, {args.reps} interleaved forwards, µs; "
          f"before: {args.before}")
    print(f"{'variant':28s} {'median':>10s} {'q1':>10s} {'q3':>10s} {'vs compile':>11s} {'max |diff| vs eager':>20s}")
    for n, v in times.items():
        q = statistics.quantiles(v, n=4)
        print(f"{n:28s} {med[n]:10.1f} {q[0]:10.1f} {q[2]:10.1f} {med['compile'] / med[n]:10.3f}x {agree[n]:20.4g}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, f"compile_paths-{args.workload}-{args.before}.json").write_text(json.dumps(
            {"workload": args.workload, "before": args.before, "device": name, "torch": torch.__version__, "times_us": times,
             "max_abs_diff_vs_eager": agree}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
