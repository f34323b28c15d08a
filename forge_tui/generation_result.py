"""The last ``forge bench --generate`` result of a workspace, kept in it for the app to show.

``forge bench WORKLOAD -w WS --generate N`` (and ``b`` in the app on a workload that generates)
writes its result's JSON (``GenBenchResult.to_json``) to ``.forge/bench/generate.json`` in the
workspace, beside the runtime's own ``.forge/runtime/status.json``: a measurement of this machine,
not part of the workspace's history (``.forge/`` is git-ignored). ``tokens_lines`` says it in a few
lines: prefill and decode tokens per second, eager against eager + forge, per batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

GENERATE_FILE = Path(".forge") / "bench" / "generate.json"


def save(root: Path | str, result: dict[str, Any]) -> Path:
    """Write ``result`` (``GenBenchResult.to_json()``) as the workspace's last generation bench,
    whole or not at all (a temporary file renamed over it)."""
    path = Path(root) / GENERATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return path


def load(root: Path | str) -> dict[str, Any] | None:
    """The workspace's last generation bench, or None where there is none or it does not read."""
    try:
        data = json.loads((Path(root) / GENERATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def _median(stats: Any) -> float | None:
    if isinstance(stats, dict) and isinstance(stats.get("median"), (int, float)):
        return float(stats["median"])
    return None


def _pair(eager: float | None, forge: float | None) -> str:
    """"eager → forge (ratio)" in tokens/s; "-" for a side not measured."""
    if eager is None and forge is None:
        return "-"
    e = f"{eager:.0f}" if eager is not None else "-"
    f = f"{forge:.0f}" if forge is not None else "-"
    ratio = f" ({forge / eager:.2f}x)" if eager and forge is not None else ""
    return f"{e} → {f}{ratio}"


def _alone(eager: float | None, forge: float | None) -> str:
    """"forge (ratio over eager)" in tokens/s; "-" where eager + forge was not measured."""
    if forge is None:
        return "-"
    return f"{forge:.0f}" + (f" ({forge / eager:.2f}x)" if eager else "")


def _batches(data: dict[str, Any], compact: bool = False) -> list[str]:
    """Per batch: "batch B: prefill E → F (R), decode E → F (R)" in tokens/s, eager's then eager +
    forge's (``compact``: "batch B prefill F (R), decode F (R)", eager + forge's alone), or why
    eager + forge has none, and its tokens where they do not agree."""
    pair = _alone if compact else _pair
    rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
    out = []
    for batch in sorted({int(r["batch"]) for r in rows if isinstance(r.get("batch"), int)}):
        by = {r.get("way"): r for r in rows if r.get("batch") == batch}
        e, f = by.get("eager", {}), by.get("eager+forge", {})
        if f.get("error"):
            out.append(f"batch {batch}: eager + forge failed: {f['error']}")
            continue
        tokens = "" if f.get("agrees", True) else f"; tokens: {f.get('tokens', 'differ')}"
        out.append(f"batch {batch}{'' if compact else ':'} "
                   f"prefill {pair(_median(e.get('prefill_tok_s')), _median(f.get('prefill_tok_s')))}, "
                   f"decode {pair(_median(e.get('decode_tok_s')), _median(f.get('decode_tok_s')))}{tokens}")
    return out


def tokens_lines(data: dict[str, Any]) -> list[str]:
    """The result in a few lines (the end-to-end screen's): what ran (workload, device, prompt and
    new tokens), then per batch the prefill and decode tokens/s of eager and eager + forge, with
    the ratio of the two medians."""
    head = (f"tokens/s, eager → eager + forge (forge bench --generate {data.get('new_tokens', '?')}, "
            f"{data.get('workload', '?')} on {data.get('device', '?')}, prompts of {data.get('prompt_len', '?')} tokens)")
    return [head, *(f"  {line}" for line in _batches(data))]


def summary_line(data: dict[str, Any]) -> str:
    """The result in one line (the op table's summary): eager + forge's tokens/s and their ratio
    over eager's, per batch."""
    return "tokens/s with forge (vs eager): " + "; ".join(_batches(data, compact=True) or ["no batch measured"])
