"""Nsight Compute on one launch of a candidate, parsed into the numbers a kernel writer reads.

``ncu --clock-control none`` (the clocks stay as the machine has them) profiles the kernels the
candidate launches inside an NVTX range around one call, after a warm-up call. Where ncu is
missing, or the backend is the CPU, the result says "profiler unavailable" and why; it is never
an error.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

NVTX_RANGE = "forge_candidate"
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers_per_thread": "launch__registers_per_thread",
    "shared_static_bytes": "launch__shared_mem_per_block_static",
    "shared_dynamic_bytes": "launch__shared_mem_per_block_dynamic",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "local_load_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "local_store_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
}


def unavailable(reason: str) -> dict:
    return {"available": False, "reason": f"profiler unavailable: {reason}"}


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text in ("n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw``: one dict per profiled kernel, our names for the metrics."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    if units and units[0] != "" and _number(units[0]) is not None:  # no units row
        data = rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kernels = []
    for row in data:
        k: dict[str, Any] = {"kernel": row[col["Kernel Name"]] if "Kernel Name" in col else "?"}
        for ours, metric in METRICS.items():
            if metric in col and col[metric] < len(row):
                k[ours] = _number(row[col[metric]])
        kernels.append(k)
    return kernels


def summarise(kernels: list[dict[str, Any]], floor_us: float | None, bandwidth_Bps: float | None) -> dict[str, Any]:
    if not kernels:
        return unavailable("ncu profiled no kernel inside the candidate's call")
    total_ns = sum(k.get("duration_ns") or 0.0 for k in kernels)
    dram = sum((k.get("dram_read_bytes") or 0.0) + (k.get("dram_write_bytes") or 0.0) for k in kernels)
    spills = sum((k.get("local_load_bytes") or 0.0) + (k.get("local_store_bytes") or 0.0) for k in kernels)
    main = max(kernels, key=lambda k: k.get("duration_ns") or 0.0)
    out: dict[str, Any] = {
        "available": True, "tool": "ncu --clock-control none", "kernels": kernels,
        "duration_us": total_ns / 1000.0,
        "dram_throughput_pct": main.get("dram_pct"), "sm_throughput_pct": main.get("sm_pct"),
        "achieved_occupancy_pct": main.get("achieved_occupancy_pct"),
        "registers_per_thread": main.get("registers_per_thread"),
        "shared_bytes_per_block": (main.get("shared_static_bytes") or 0) + (main.get("shared_dynamic_bytes") or 0),
        "local_memory_bytes": spills, "dram_bytes": dram,
    }
    if total_ns > 0:
        out["achieved_bandwidth_Bps"] = dram / (total_ns * 1e-9)
        if bandwidth_Bps:
            out["bandwidth_fraction"] = out["achieved_bandwidth_Bps"] / bandwidth_Bps
        if floor_us:
            out["roofline_fraction"] = floor_us / (total_ns / 1000.0)
    return out


def write_request(folder: Path, card_json: dict, library: str, store_root: str) -> Path:
    """The driver's request (``_drive``: the card, the candidate's library, the tensor store)."""
    req = Path(folder) / "request.json"
    req.write_text(json.dumps({"card": card_json, "library": library, "store": store_root}))
    return req


def run_tool(cmd: list[str], what: str, timeout_s: float, cwd: str | None = None) -> "subprocess.CompletedProcess[str] | str":
    """Run a profiler's command: its completed process, or the one-line reason it failed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        return f"{what} did not finish within {timeout_s:.0f} s"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"{what} exited with status {proc.returncode}: {' | '.join(tail)}"
    return proc


def profile(card_json: dict, library: str, store_root: str, *, floor_us: float | None = None,
            bandwidth_Bps: float | None = None, timeout_s: float = 300.0) -> dict:
    exe = shutil.which("ncu")
    if exe is None:
        return unavailable("ncu (Nsight Compute) is not on PATH")
    with tempfile.TemporaryDirectory(prefix="forge-ncu-") as tmp:
        req = write_request(Path(tmp), card_json, library, store_root)
        cmd = [exe, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/", "--csv", "--page", "raw",
               "--metrics", ",".join(METRICS.values()), sys.executable, "-m", "forge_tui.evaluator.ncu", str(req)]
        proc = run_tool(cmd, "ncu", timeout_s)
        if isinstance(proc, str):
            return unavailable(proc)
        result = summarise(parse_csv(proc.stdout), floor_us, bandwidth_Bps)
        result["raw_csv"] = "\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith('"'))
        return result


def _drive(request_path: str) -> int:
    """Inside ncu: one warm-up call, then one call in the NVTX range ncu filters on."""
    import torch

    from ..cards import Card
    from ..inputs import random_inputs, sample_inputs
    from ..kernel_abi import Library, alloc_outputs, card_scalars, workspace_for
    from ..tensorstore import TensorStore

    req = json.loads(Path(request_path).read_text())
    card = Card.model_validate(req["card"])
    store = TensorStore(req["store"])
    try:
        ins = sample_inputs(card, store, 0, "cuda") if card.samples else random_inputs(card, "cuda", seed=1)
    except FileNotFoundError:
        ins = random_inputs(card, "cuda", seed=1)
    outs = alloc_outputs(card.outputs, "cuda")
    lib = Library(req["library"])
    scalars = card_scalars(card.program)
    ws = workspace_for(lib, ins, outs, scalars, "cuda")
    call = lib.bind(ins, outs, scalars, torch.cuda.current_stream().cuda_stream, ws)
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(_drive(sys.argv[1]))
