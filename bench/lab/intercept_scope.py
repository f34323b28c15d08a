"""Answers: what does an op card's interceptor cost a forward when its scope covers a module's
whole subtree (how op cards outside leaf modules were served before 469bfaa, when the subtree was
the whole model) against when it is the module whose own forward makes the call, its children
running outside it (since)? Counts the ops that pass through the interceptor per forward and times
the forward three ways, interleaved: eager, each decoder layer intercepted with its whole subtree,
and only the layers' own calls. The subtree variant wraps the layers, not the whole model (the
embedding, rotary, final norm and head stay out), so it understates the old cost. The table never
matches (a pure pass-through), so the numbers are the interception's cost alone.

    python bench/lab/intercept_scope.py [--device cpu|cuda] [--repeats 30]

cpu uses tiny_decoder; cuda the bundled decoder. Prints a table; JSON to $OUT if set.

Answer on the 2-core development machine (2026-12-01, torch 2.13.0+cpu, one thread, four runs):
tiny_decoder's forward sends 188 ops through the interceptor with the layers' subtrees, and 4 (the
two layers' residual adds) with their own calls. Against eager, paired medians: 0.34-0.38x with the
subtrees, 0.79-0.84x with the own calls. What the own calls still cost on a 1 ms CPU forward is the
mode's entry per layer call, its pop and push around each of the 8 child calls, and the 4 ops
(measured apart, in a loop: about 5 µs an op under a warm mode and 3 µs a pop and push; the first op
under each new mode type is far slower, a warm-up).

Answer on the H200 (2026-12-01, torch 2.11.0+cu130, the bundled decoder): 800 ops a forward through
the interceptor with the layers' subtrees, 16 with their own calls; paired against eager, 0.579x
[0.565, 0.629] with the subtrees and 0.967x [0.941, 0.994] with the own calls (18.2 ms forward).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    import torch

    from forge_tui.runtime import intercept as rt
    from forge_tui.runtime.forwards import called_children
    from forge_tui.timing import Timer, paired_ratio
    from forge_tui.workload import load_workload

    name = "tiny_decoder" if args.device == "cpu" else "decoder"
    wl = load_workload(str(ROOT / "forge_tui" / "examples" / f"{name}.py"))
    if args.device == "cpu":
        torch.set_num_threads(1)

    counts: dict[str, int] = {}
    base = rt.interceptor_class()

    class Counting(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[self.label] = counts.get(self.label, 0) + 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    def interceptor(label: str):
        def make(table, owner=None):
            m = Counting(table, owner)
            m.label = label
            return m
        return make

    # a table that never matches: what is measured is the trip through Python alone
    stub = SimpleNamespace(guard=SimpleNamespace(status=SimpleNamespace(active=True)))
    table = {torch.ops.aten.cosh.default: [stub]}

    def build(kind: str):
        model, inputs = wl.build(args.device, None)
        model.eval()
        if kind == "eager":
            return model, inputs
        layers = [m for n, m in model.named_modules() if n.count(".") == 1 and n.startswith("layers.")]
        outside = []
        for layer in layers:
            owner = object()
            layer.forward = rt.intercepting(layer.forward, interceptor(kind), table, None, owner)
            if kind == "own calls":
                outside.extend((c, owner) for c in called_children(layer))
        for child, owner in outside:
            child.forward = rt.outside_scope(child.forward, owner)
        return model, inputs

    variants = {k: build(k) for k in ("eager", "whole subtree", "own calls")}
    with torch.no_grad():
        for k, (m, inp) in variants.items():
            counts.pop(k, None)
            wl.run(m, inp)
        per_forward = {k: counts.get(k, 0) for k in variants}
        timer = Timer(args.device, warmup=3, repeats=args.repeats, cold_l2=False)
        stats, raw, _ = timer.time({k: (lambda m=m, inp=inp: wl.run(m, inp)) for k, (m, inp) in variants.items()})
    rows = []
    print(f"{name} on {args.device}: ops through the interceptor per forward, forward time (median, q1-q3), "
          f"eager / variant (paired)")
    for k in variants:
        st = stats[k]
        r = paired_ratio(raw["eager"], raw[k]) if k != "eager" else None
        rows.append({"variant": k, "ops_intercepted": per_forward[k], "median_us": st.median, "q1_us": st.q1,
                     "q3_us": st.q3, "vs_eager": None if r is None else [r.median, r.q1, r.q3]})
        print(f"  {k:14s} {per_forward[k]:6d} ops  {st.median:10.1f} µs ({st.q1:.1f}-{st.q3:.1f})  "
              + ("-" if r is None else f"{r.median:.3f}x [{r.q1:.3f}, {r.q3:.3f}]"))
    out = os.environ.get("OUT")
    if out:
        Path(out, "intercept_scope.json").write_text(json.dumps({"workload": name, "device": args.device,
                                                                 "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
