"""Nsight Systems on a candidate: the kernels its call launches, how many and how long each.

Where Nsight Compute reads one launch's counters, ``nsys`` shows the call as a timeline summary:
a candidate that launches more kernels than it should (a forgotten reduction pass, a memset, a
kernel per row), or one launch that dominates. It runs the same driver as Nsight Compute
(``evaluator/ncu.py``: one warm-up call, one call in an NVTX range) under ``nsys profile`` and
reads ``nsys stats --report cuda_gpu_kern_sum``. Where nsys is missing the result says so; it is
never an error.
"""

from __future__ import annotations

import csv
import io
import shutil
import sys
import tempfile
from pathlib import Path

from .ncu import run_tool, write_request

CALLS = 2
"""Calls the driver makes (a warm-up and the measured one): launches a call = instances / CALLS."""

COLUMNS = {"Total Time (ns)": "total_ns", "Instances": "instances", "Avg (ns)": "avg_ns", "Med (ns)": "median_ns",
           "Min (ns)": "min_ns", "Max (ns)": "max_ns"}


def unavailable(reason: str) -> dict:
    return {"available": False, "reason": reason}


def parse_kern_sum(text: str) -> list[dict]:
    """Rows of ``nsys stats --report cuda_gpu_kern_sum --format csv``: one dict per kernel name,
    launches per call and times in microseconds. Lines before the CSV header (nsys's notices) are
    skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip('"').startswith("Time (%)")), None)
    if start is None:
        return []
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name = (row.get("Name") or "").strip()
        if not name:
            continue
        k: dict = {"kernel": name}
        for col, key in COLUMNS.items():
            try:
                v = float((row.get(col) or "").replace(",", ""))
            except ValueError:
                continue
            if key == "instances":
                k["launches_per_call"] = v / CALLS
            else:
                k[key.replace("_ns", "_us")] = v / 1000.0
        out.append(k)
    return out


def timeline(card_json: dict, library: str, store_root: str, *, timeout_s: float = 300.0) -> dict:
    exe = shutil.which("nsys")
    if exe is None:
        return unavailable("nsys (Nsight Systems) is not on PATH")
    with tempfile.TemporaryDirectory(prefix="forge-nsys-") as tmp:
        req = write_request(Path(tmp), card_json, library, store_root)
        rep = Path(tmp) / "timeline"
        steps = [
            [exe, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
             "-o", str(rep), sys.executable, "-m", "forge_tui.evaluator.ncu", str(req)],
            [exe, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export=true",
             str(rep) + ".nsys-rep"],
        ]
        out = ""
        for cmd in steps:
            proc = run_tool(cmd, f"nsys {cmd[1]}", timeout_s, cwd=tmp)
            if isinstance(proc, str):
                return unavailable(proc)
            out = proc.stdout
        kernels = parse_kern_sum(out)
        if not kernels:
            return unavailable("nsys recorded no kernel launch (the candidate launched nothing on the GPU?)")
        return {"available": True, "reason": "", "kernels": kernels,
                "launches_per_call": sum(k.get("launches_per_call", 0.0) for k in kernels)}
