"""Asks: why does the diffusion VAE's channels-last GroupNorm module card (an NHWC view of
1x512x128x128 fp16 copied to NCHW, then normalised in 32 groups) stay at about 36% of a same-size
copy on the H200 whether its kernel walks each group over a cluster (split=8) or the whole tensor
in memory order (grid=tiles, 2026-12-02 tenth session: 53 µs both, against a 20 µs copy)? Runs
Nsight Compute on the generator's kernels for the card and on a probe that only moves its bytes,
and prints duration, DRAM traffic and throughput, occupancy, registers, then (--detail) ncu's
details page (speed of light, memory, warp stalls) of each.

    python bench/lab/gn_layout_ncu.py [--detail] [--timeout S]

Prints a table; writes $OUT/gn_layout_ncu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "lab"))

WORKLOAD = '''
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(32, 512, eps=1e-6)

    def forward(self, x):
        return self.norm(x)


def get_model():
    return Model().half()


def get_inputs():
    # the VAE attention's output: (b, hw, c) transposed and reshaped to (b, c, h, w)
    return [torch.randn(1, 128 * 128, 512, dtype=torch.float16).transpose(1, 2).reshape(1, 512, 128, 128)]
'''

CONFIGS = [
    {"grid": "tiles", "cache": "smem", "tpr": 1024, "vec": 8, "bps": 2, "split": 1, "rpb": 1},
    {"grid": "tiles", "cache": "smem", "tpr": 512, "vec": 8, "bps": 2, "split": 1, "rpb": 1},
    {"grid": "tiles", "cache": "none", "tpr": 1024, "vec": 8, "bps": 2, "split": 1, "rpb": 1},
    {"grid": "rows", "cache": "regs", "tpr": 1024, "vec": 8, "bps": 1, "split": 8, "rpb": 1},
]


def main() -> int:
    import torch
    from ncu_probe import probe_source, profile_source

    from forge_tui.codegen import Generated
    from forge_tui.evaluator.build import Builder
    from forge_tui.workspace import profile_into_workspace

    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--detail", action="store_true")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-gn-ncu-"))
    (tmp / "forge.toml").write_text("[timing]\nwarmup = 1\nrepeats = 2\n[profile]\nsamples_per_card = 1\n"
                                    "max_sample_mib = 1200.0\n")
    (tmp / "w.py").write_text(WORKLOAD)
    ws, _ = profile_into_workspace(tmp / "w.py", tmp / "ws", device="cuda", config_path=tmp / "forge.toml")
    gen = Generated()
    cards = [c for c in ws.cards() if gen.match(c) is not None and "roup" in c.id]
    card = max(cards, key=lambda c: (c.id.startswith("mod-"), c.bytes))  # the module card: the copy and the norm
    m = gen.match(card)
    k = m.info["kernel"]
    print(f"card {card.id}: rows {k.rows} cols {k.cols}, first configuration {gen.initial(m, 'cuda')}", flush=True)
    builder = Builder("cuda", tmp / "build", arch="sm_90")
    report = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/lab/gn_layout_ncu.py " + " ".join(sys.argv[1:]), "card": card.id, "rows": []}
    sources = [("probe: move the bytes", probe_source(card))]
    for p in CONFIGS:
        if gen.valid(m, p, "cuda"):
            sources.append((" ".join(f"{a}={v}" for a, v in sorted(p.items())), gen.render(m, p, "cuda")))
        else:
            print(f"skip invalid {p}", flush=True)
    for label, src in sources:
        row = profile_source(builder, card, ws, f"{label[:70]:70s}", src, args.timeout, args.detail)
        if row is not None:
            report["rows"].append({"config": label, **row})
        (out / "gn_layout_ncu.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
