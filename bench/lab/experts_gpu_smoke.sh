#!/usr/bin/env bash
# Answers: does `forge experts` at HEAD promote and serve on the GPU end to end (profile, experts,
# apply op by op and in a CUDA graph capture, status), for the CPU-sized moe example in fp32 and bf16?
set -euo pipefail
ws=$(mktemp -d)/ws
python3 -m forge_tui.cli profile example:tiny_moe -w "$ws" --device cuda --dtype bf16 > /dev/null
python3 -m forge_tui.cli experts example:tiny_moe -w "$ws" --device cuda --dtype bf16 --min-speedup 0
python3 - "$ws" <<'PY'
import sys, torch
from forge_tui.examples import tiny_moe
from forge_tui.runtime.apply import apply
torch.manual_seed(0)
m = tiny_moe.get_model().to("cuda", torch.bfloat16).eval()
x = [t.to("cuda") for t in tiny_moe.get_inputs()]
with torch.no_grad():
    ref = m(*x)
    with apply(m, sys.argv[1], trial_calls=0) as a:
        y = m(*x)
        print("op by op: equal to eager:", all(torch.equal(p, q) for p, q in zip(y, ref)))
    with apply(m, sys.argv[1], mode="cuda_graph") as a:
        m(*x)  # the first call is checked outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = m(*x)
        g.replay()
        torch.cuda.synchronize()
        print("graph: equal to eager:", all(torch.equal(p, q) for p, q in zip(yg, ref)))
        print({c["card"]: (c["served"], dict(c["fallbacks"])) for c in a.status()["cards"] if c["kind"] == "experts"})
PY
