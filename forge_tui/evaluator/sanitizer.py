"""compute-sanitizer (memcheck, initcheck) on one call of a candidate, where it exists.

Initcheck finds reads of device memory nothing wrote (anticheat pattern 2: uninitialised memory
that happens to pass); memcheck finds out-of-bounds accesses that did not crash. The candidate
runs in the same driver as the Nsight Compute profile (evaluator/ncu.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


def sanitize(card_json: dict, library: str, store_root: str, tools=("memcheck", "initcheck"),
             timeout_s: float = 600.0) -> dict:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        return {"available": False, "reason": "compute-sanitizer is not on PATH"}
    out: dict = {"available": True, "tools": {}}
    with tempfile.TemporaryDirectory(prefix="forge-sanitize-") as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"card": card_json, "library": library, "store": store_root}))
        for tool in tools:
            cmd = [exe, "--tool", tool, "--print-limit", "5", sys.executable, "-m", "forge_tui.evaluator.ncu", str(req)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                out["tools"][tool] = {"errors": None, "note": f"did not finish within {timeout_s:.0f} s"}
                continue
            text = proc.stdout + proc.stderr
            m = _SUMMARY.search(text)
            errors = int(m.group(1)) if m else None
            first = [ln.strip() for ln in text.splitlines() if ln.startswith("=========") and "ERROR SUMMARY" not in ln][:6]
            out["tools"][tool] = {"errors": errors, "report": first}
    out["errors"] = sum((t.get("errors") or 0) for t in out["tools"].values())
    return out
