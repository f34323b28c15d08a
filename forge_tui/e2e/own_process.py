"""torch.compile and torch.compile + forge timed again in a process of their own
(``python -m forge_tui.compile_pair``): the check that confirms a verdict to keep forge's kernels
in compiled models."""

from __future__ import annotations

import json
from typing import Any

from .options import BenchOptions

FRESH_TIMEOUT_S = 900.0
"""The process of its own: two compiles of the model with a cold inductor cache (tens of seconds
each for a ResNet-50) and the timing."""
FRESH_MIN_S = 10.0
"""Less time than this before the deadline: the process of its own is not started (the kernels go
off in compiled models, unconfirmed)."""


def fresh_compile_pair(workload_spec: Any, ws: Any, dev: str, options: BenchOptions,
                       timeout_s: float = FRESH_TIMEOUT_S) -> tuple[dict[str, list[float]], dict[str, int]] | str:
    """torch.compile and torch.compile + forge timed in a process of their own
    (``python -m forge_tui.compile_pair``) on ``dev`` with ``options``' dtype, repeats, warm-up,
    backend and kernels: (their samples, the calls served per card), or why there are none."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not isinstance(workload_spec, (str, Path)):
        return "the workload is not a file a process of its own can load"
    cmd = [sys.executable, "-m", "forge_tui.compile_pair", str(workload_spec), str(ws.root), "--device", dev,
           "--repeats", str(options.repeats), "--warmup", str(options.warmup), "--backend", options.compile_backend]
    if options.dtype is not None:
        cmd += ["--dtype", str(options.dtype).removeprefix("torch.")]
    if not options.only_faster:
        cmd.append("--all-kernels")
    # the same forge_tui as this process's, installed or not
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"it did not finish in {timeout_s:.0f} s"
    except OSError as exc:
        return f"it did not start: {exc}"
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    try:
        got = json.loads(last) if done.returncode == 0 else None
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(k in got.get("raw", {}) for k in ("compile", "compile+forge")):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"it exited with status {done.returncode}: {tail[:300]}"
    return got["raw"], got.get("served", {})
