"""Answers: what does one attention layer of a model we did not write (Hugging Face's Llama, built
from its configuration, random weights) cost a call, eager against eager + forge, where forge
serves its rotary application as one chain card (its slices, negation and join links of the chain,
since the capture takes index links) or as the cards the capture made before (a join card, a
product card and a product-and-sum chain for each of q and k)? The layer is timed alone, called
with the arguments the model gave it, in one process, the variants interleaved in rounds.

    python bench/e2e_bench.py bench/workloads/hf_llama.py --keep-workspace /tmp/new ...   # each capture
    python bench/lab/rotary_chain_host.py WS_NEW [WS_OLD] [--calls 2000] [--rounds 5] [--all-kernels]

Prints µs a call per variant and round, and the cards each workspace served in the layer.

Answer on the development machine's CPU (2026-12-05, torch 2.13.0+cpu, transformers 5.25, the
CPU-sized Llama: 4 heads of 16, 2 kv heads, 16 tokens, bf16; medians of 7 rounds of 1500 calls,
two runs, every kernel on): eager 276.2 | 276.6 µs a call; the rotary as one chain card a
rotation (2 served calls) 266.5 | 265.1, 10-12 below eager; as the capture made it before (a join,
a negation, a product and a product-and-sum chain a rotation: 8 served calls) 320.8 | 324.2, 45-48
above eager. The earlier capture's split is what the H200 measured as the attention's +73 to +138
µs a call against eager (docs/benchmarks.md, 2026-12-04 night).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WORKLOAD = ROOT / "bench" / "workloads" / "hf_llama.py"


def _all_on(ws: Path) -> str:
    """A copy of workspace ``ws`` with every promoted kernel switched on (the bench's verdicts
    cleared), named like it."""
    import json
    import shutil
    import tempfile

    copy = Path(tempfile.mkdtemp()) / ws.parent.name / ws.name
    shutil.copytree(ws, copy)
    path = copy / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry.update(enabled=True, disabled_reason="")
    path.write_text(json.dumps(data))
    return str(copy)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workspaces", nargs="+", help="workspaces of the same workload (each a variant)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layer", default="model.model.layers.0.self_attn")
    ap.add_argument("--workload", default=str(WORKLOAD), help="default: bench/workloads/hf_llama.py")
    ap.add_argument("--all-kernels", action="store_true",
                    help="serve the kernels the bench switched off too (applied to a copy of each workspace)")
    args = ap.parse_args(argv)
    if args.all_kernels:
        args.workspaces = [_all_on(Path(w)) for w in args.workspaces]

    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload
    from forge_tui.workspace import Workspace

    wl = load_workload(args.workload)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    variants: dict[str, tuple] = {}
    served: dict[str, dict[str, int]] = {}
    for name, ws in [("eager", None)] + [(f"forge {k}: {Path(w).parent.name}/{Path(w).name}", w) for k, w in enumerate(args.workspaces)]:
        model, inputs = wl.build(args.device)
        model.eval()
        applied = apply(model, Workspace.open(Path(ws)), device=args.device, trial_calls=0,
                        only_faster=False) if ws else None
        layer = model.get_submodule(args.layer)
        seen: list[tuple] = []
        hook = layer.register_forward_pre_hook(lambda m, a, k, seen=seen: seen.append((a, k)) if not seen else None,
                                               with_kwargs=True)
        with torch.no_grad():
            wl.run(model, inputs)
        hook.remove()
        call_args, call_kwargs = seen[0]
        variants[name] = (layer, call_args, call_kwargs, applied)
    times: dict[str, list[float]] = {n: [] for n in variants}
    with torch.no_grad():
        for layer, a, k, _ in variants.values():
            for _ in range(50):
                layer(*a, **k)
        for _ in range(args.rounds):
            for name, (layer, a, k, _) in variants.items():
                sync()
                t0 = time.perf_counter_ns()
                for _ in range(args.calls):
                    layer(*a, **k)
                sync()
                times[name].append((time.perf_counter_ns() - t0) / args.calls / 1000)
    for name, (_, _, _, applied) in variants.items():
        if applied is not None:
            served[name] = {c["card"]: c["served"] for c in applied.status()["cards"] if c["served"]}
            applied.undo()
    base = statistics.median(times["eager"])
    print(f"{args.layer} on {args.device}, {args.calls} calls a round, {args.rounds} rounds (µs a call)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<40} median {med:8.1f}  rounds {' '.join(f'{t:.1f}' for t in ts)}  vs eager {med - base:+.1f}")
    for name, cards in served.items():
        print(f"  {name}: served {cards}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
