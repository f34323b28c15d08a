"""Answers: how much of the diffusion VAE attention's time (baddbmm, softmax, bmm over a 16384 x 16384
score matrix, head dim 512, fp16) would a fused attention save on this GPU, which of PyTorch's SDPA
backends take head dim 512, and how far is each from the explicit ops' output?

Run: ``python bench/lab/vae_sdpa_probe.py`` (GPU). Prints a table; JSON to ``$OUT`` if set.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def med_us(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return {"median": statistics.median(ts), "q1": ts[len(ts) // 4], "q3": ts[3 * len(ts) // 4]}


def main():
    torch.manual_seed(0)
    b, n, d = 1, 16384, 512
    q, k, v = (torch.randn(b, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    scale = d ** -0.5

    def explicit():
        probs = torch.softmax(torch.baddbmm(torch.empty(b, n, n, dtype=q.dtype, device=q.device), q,
                                            k.transpose(1, 2), beta=0, alpha=scale), dim=-1)
        return torch.bmm(probs, v)

    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [b, n, d]}
    ref = explicit()
    out["explicit"] = med_us(explicit)
    print(f"explicit baddbmm+softmax+bmm: {out['explicit']}", flush=True)
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
        def fused(be=be):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], scale=scale)[:, 0]
        try:
            y = fused()
            err = float((y.float() - ref.float()).abs().max())
            rel = float((y.float() - ref.float()).pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt())
            t = med_us(fused)
            out[name] = {"time_us": t, "max_abs_diff": err, "rel_rms_diff": rel,
                         "speedup": out["explicit"]["median"] / t["median"]}
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": str(exc).splitlines()[0][:200]}
        print(f"{name}: {out[name]}", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "vae_sdpa_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
