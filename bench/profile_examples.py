"""Profile bundled GPU-sized examples on the device machine and report their op tables.

    python bench/profile_examples.py resnet50 decoder diffusion moe

Writes, under $OUT (or ./bench-out): <example>.optable.txt, profiles.json (forward times, device
ceilings, top cards per example). Prints the top of each table and a summary table last.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = """
[timing]
warmup = 3
repeats = 20
cold_l2 = true

[profile]
samples_per_card = 1
max_sample_mib = 256.0
"""


def main(names: list[str]) -> int:
    import torch

    from forge_tui.table import render
    from forge_tui.workspace import profile_into_workspace

    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    cfg = tmp / "forge.toml"
    cfg.write_text(CONFIG)
    summary: dict = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                     "command": "python bench/profile_examples.py " + " ".join(names), "examples": {}}
    rows = []
    for name in names:
        t0 = time.time()
        ws, result = profile_into_workspace(f"example:{name}", tmp / name, config_path=cfg,
                                            progress=lambda m, name=name: print(f"  [{name}] {m}", flush=True) if "card" not in m else None)
        wall = time.time() - t0
        title = (f"{name} on {result.device_name}, {result.dtype}: forward {result.forward.median / 1000:.2f} ms "
                 f"(spread {100 * result.forward.spread:.1f}%), {len(result.cards)} cards")
        table = render(result.cards, title=title)
        (out / f"{name}.optable.txt").write_text(table)
        print(render(result.cards, title=title, limit=25), flush=True)
        for w in result.warnings:
            print(f"  warning: {w}")
        cov = result.coverage
        summary["examples"][name] = {
            "forward_us": result.forward.to_json(), "cards": len(result.cards), "coverage": cov,
            "profile_wall_s": wall, "skipped": result.skipped, "warnings": result.warnings,
            "ceilings": result.ceilings,
            "top": [c.model_dump(mode="json", exclude={"program", "samples"}) for c in result.cards[:40]],
        }
        rows.append((name, result.dtype, result.forward.median / 1000, 100 * result.forward.spread, len(result.cards),
                     100 * cov["op"], wall))
        del ws, result
        torch.cuda.empty_cache()
    (out / "profiles.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{'example':10s} {'dtype':9s} {'fwd ms':>8s} {'spread':>7s} {'cards':>6s} {'op cover':>9s} {'wall s':>7s}")
    for r in rows:
        print(f"{r[0]:10s} {str(r[1]):9s} {r[2]:8.2f} {r[3]:6.1f}% {r[4]:6d} {r[5]:8.0f}% {r[6]:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["resnet50", "decoder", "diffusion", "moe"]))
