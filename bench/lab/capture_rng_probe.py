"""Asks: after a forward fails to be captured in a CUDA graph (it synchronises with the host),
can the process still draw random numbers on the GPU, with and without forge's repair
(``forge_tui.runtime.pieces.end_failed_capture``)? On the H200 the MoE example's bench lost every later
phase to "Offset increment outside graph capture encountered unexpectedly" after its capture
failed (docs/runs/data/2026-12-01-s3/call3-e2e.log).

    python bench/lab/capture_rng_probe.py

Each case runs in a fresh process; prints a table, JSON to $OUT when set.

Answer on the H200 (2026-12-01, torch 2.11.0+cu130, docs/runs/data/2026-12-01-s3/call4-*): without
the repair, the failed capture leaves the generator in capture and the next random op raises
"Offset increment outside graph capture encountered unexpectedly"; with it, the process draws
random numbers again, and the MoE example's bench ran every phase after its failed capture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys, torch
sys.path.insert(0, sys.argv[2])
from forge_tui import e2e
repair = sys.argv[1] == "repair"
x = torch.randn(8, device="cuda")
def forward():
    y = torch.rand_like(x) * x  # random numbers inside the capture, as dropout would
    return y[y.nonzero()]       # a host synchronisation: the capture fails here
if repair:
    try:
        e2e.cuda_graphed(forward)
    except Exception as exc:
        print("capture failed:", type(exc).__name__, str(exc)[:120])
else:
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward()
    except Exception as exc:
        print("capture failed:", type(exc).__name__, str(exc).splitlines()[0][:120])
    torch.cuda.set_stream(torch.cuda.default_stream())
try:
    torch.randn(4, device="cuda").sum().item()
    print("random after: ok")
except Exception as exc:
    print("random after:", type(exc).__name__, str(exc).splitlines()[0][:120])
"""


def main() -> int:
    rows = {}
    for case in ("plain", "repair"):
        r = subprocess.run([sys.executable, "-c", CHILD, case, str(ROOT)], capture_output=True, text=True, timeout=300)
        rows[case] = (r.stdout + r.stderr).strip().splitlines()[-2:]
        print(f"{case:8s} | " + " | ".join(rows[case]))
    out = os.environ.get("OUT")
    if out:
        Path(out, "capture_rng_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
