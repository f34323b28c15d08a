"""Asks: does torch.compile compile every one of many generated reference programs in one
process, or does it run eager's code after the 8th? On the H200 (torch 2.11), codegen_bench's
device-time column had torch.compile's kernels at eager's time for every case after the first
eight, and Dynamo warned that it hit ``recompile_limit (8)`` on ``external_utils.inner``: a
function exec'd from a string has no source file Dynamo can find, so it is traced through
``wrap_inline``'s one shared wrapper, whose cache holds 8 variants.

    python bench/lab/dynamo_exec_limit.py [--programs 12] [--device cuda]

Compiles ``--programs`` distinct three-op pointwise programs (``x * k + k`` then ``relu``), each
through ``forge_tui.program.compile_source`` as it is now (source registered under a file name
of its own) and, in a second process, as it was before (``exec`` of the bare string), and times
each compiled program against eager on the device (``Timer.device_us``). Prints, per way, how
many programs ran faster than eager (inductor fuses the three ops into one pass). JSON to $OUT.

Answer (2026-12-05, an H100, torch 2.11.0+cu130, ``docs/runs/data/2026-12-05-s6/call1-dynamo-h100.log``):
with a file name of its own, 12 of 12 compiled programs ran faster than eager (0.34-0.35 of its
device time); the old way, 8 of 12, the 9th to 12th at eager's time (1.00): the ninth exec'd
program onwards ran eager's code under torch.compile's name, as codegen_bench saw on the H200.
On the development machine (torch 2.13.0+cpu) both ways compile every program: torch 2.13 traces
an exec'd function directly (pytorch#124269), so the fault is torch 2.11's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def program(k: int) -> dict:
    return {"nodes": [{"op": "aten.mul.Tensor", "args": [{"$in": 0}, float(k + 2)]},
                      {"op": "aten.add.Tensor", "args": [{"$node": 0}, float(k + 1)]},
                      {"op": "aten.relu.default", "args": [{"$node": 1}]}],
            "outputs": [{"$node": 2}]}


def one_way(way: str, n: int, device: str) -> dict:
    import torch

    from forge_tui import program as prog
    from forge_tui.timing import Timer

    def bare(p: dict, n_inputs: int):  # compile_source before 2026-12-05
        namespace: dict = {"torch": torch, "_flat": prog.flatten_outputs}
        exec(prog.program_source(p, n_inputs), namespace)  # noqa: S102 - our own generated code
        return namespace["reference"]

    make = prog.compile_source if way == "file" else bare
    x = torch.randn(1 << 24, device=device)
    timer = Timer(device, cold_l2=device == "cuda")
    rows = []
    for k in range(n):
        fn = make(program(k), 1)
        compiled = torch.compile(fn, dynamic=False)
        compiled(x, device=device)
        clock = timer.device_us if device == "cuda" else Timer._one_cpu
        e = sorted(clock(lambda f=fn: f(x, device=device)) for _ in range(9))[4]
        c = sorted(clock(lambda f=compiled: f(x, device=device)) for _ in range(9))[4]
        rows.append({"program": k, "eager_us": e, "compile_us": c, "compiled_faster": c < 0.8 * e})
    return {"way": way, "rows": rows, "faster": sum(r["compiled_faster"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=12)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--way", choices=["file", "bare"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.way:
        print(json.dumps(one_way(a.way, a.programs, a.device)))
        return 0
    out = {}
    for way in ("file", "bare"):
        r = subprocess.run([sys.executable, __file__, "--way", way, "--programs", str(a.programs),
                            "--device", a.device], capture_output=True, text=True, timeout=400)
        if r.returncode != 0:
            print(f"{way}: failed\n{r.stderr[-2000:]}")
            continue
        out[way] = json.loads(r.stdout.strip().splitlines()[-1])
        res = out[way]
        print(f"{way:5s}: {res['faster']} of {len(res['rows'])} compiled programs faster than eager; "
              + ", ".join(f"{r['compile_us'] / r['eager_us']:.2f}" for r in res["rows"]))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dynamo_exec_limit.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
