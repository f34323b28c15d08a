"""torch.compile and torch.compile + forge timed against each other in a process of their own.

``forge bench`` times its four variants in one process. For torch.compile that process is not a
sound baseline: a compiled forward bound by its host can run far slower inside the bench's process
than in a fresh one, with the same kernels, the same Dynamo graph and no recompile, and then
torch.compile + forge looks faster than torch.compile where a process of its own finds it slower
(docs/benchmarks.md, "torch.compile's baseline"). The bench's verdict to keep forge's kernels in
compiled models is therefore confirmed here (``e2e.own_process.fresh_compile_pair``): the model built afresh,
the kernels applied as ``Mode.TORCH_COMPILE`` gives them, both variants compiled and timed
interleaved by the bench's protocol. The last line of stdout is a JSON object: the samples (µs)
per variant and the calls served per card.

    python -m forge_tui.compile_pair WORKLOAD WS [--device D] [--dtype T] [--repeats N]
        [--warmup N] [--backend inductor] [--all-kernels]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any


def time_pair(spec: str, workspace: str, *, device: str | None = None, dtype: str | None = None, repeats: int = 20,
              warmup: int = 3, backend: str = "inductor", only_faster: bool = True) -> dict[str, Any]:
    """The samples of torch.compile and torch.compile + forge, interleaved (µs), and the calls
    served per card in the compiled forwards."""
    import torch

    from .e2e.memory import GcPauses
    from .runtime.apply import Mode, apply
    from .timing import Timer
    from .workload import load_workload, parse_dtype, resolve_device

    dev = resolve_device(device)
    wl = load_workload(spec)
    model, inputs = wl.build(dev, parse_dtype(dtype))
    model.eval()
    base = torch.compile(copy.deepcopy(model), backend=backend)
    cf = copy.deepcopy(model)
    applied = apply(cf, workspace, mode=Mode.TORCH_COMPILE, device=dev, only_faster=only_faster)
    try:
        with_forge = torch.compile(cf, backend=applied.backend(backend))
        pauses = GcPauses()
        fns = {"compile": lambda: pauses.run("compile", wl.run, base, inputs),
               "compile+forge": lambda: pauses.run("compile+forge", wl.run, with_forge, inputs)}
        with torch.no_grad():
            for fn in fns.values():  # compiled outside the timing
                fn()
            with pauses:
                _, raw, _ = Timer(dev, warmup=warmup, repeats=repeats, cold_l2=False).time(fns)
        served = {c["card"]: c["served"] for c in applied.status()["cards"]}
    finally:
        applied.undo()
    return {"raw": raw, "served": served, "notes": pauses.notes()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m forge_tui.compile_pair", description=__doc__.split("\n\n")[0])
    ap.add_argument("workload")
    ap.add_argument("workspace")
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--all-kernels", action="store_true")
    args = ap.parse_args(argv)
    out = time_pair(args.workload, args.workspace, device=args.device, dtype=args.dtype, repeats=args.repeats,
                    warmup=args.warmup, backend=args.backend, only_faster=not args.all_kernels)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
