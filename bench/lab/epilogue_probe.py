"""Answers: does the fold's one-pass epilogue (bias, residual, ReLU: forge_tui/runtime/epilogue.py)
match PyTorch's ops on the H200, and what does a call cost the host and the GPU next to PyTorch's
in-place ops (one pass each) at ResNet-50's shapes?

    python bench/lab/epilogue_probe.py

Prints a table; JSON to $OUT if set.

Answer on the H200 (2026-12-02, docs/runs/data/2026-12-02-s11/call4-*): Triton is there and the
kernel matches PyTorch's ops exactly (fp16). GPU: 25-57 µs a call against 23-155 µs for the ops
(2.7x less at 32x256x56x56 with a residual); host: 31-42 µs against 28-47 µs, so the launch from
Python costs about what the two or three ops do.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from forge_tui.runtime import epilogue  # noqa: E402

SHAPES = [(32, 64, 56, 56), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7)]


def torch_ops(y, b, z):
    y.add_(b.view(1, -1, 1, 1))
    if z is not None:
        y.add_(z)
    return y.relu_()


def timed(fn, n=50):
    host, gpu = [], []
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        e0.record()
        fn()
        e1.record()
        host.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        gpu.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(host), statistics.median(gpu)


def main() -> int:
    print(f"triton available: {epilogue.triton_available()}")
    rows = []
    print(f"{'shape':20} {'z':>2} {'max err':>9} {'ours host µs':>12} {'ours GPU µs':>11} {'torch host µs':>13} {'torch GPU µs':>12}")
    for shape in SHAPES:
        for with_z in (False, True):
            g = torch.Generator(device="cuda").manual_seed(0)
            y0 = torch.randn(shape, device="cuda", generator=g).half()
            b = torch.randn(shape[1], device="cuda", generator=g).half()
            z = torch.randn(shape, device="cuda", generator=g).half() if with_z else None
            ref = torch.relu(y0.float() + b.float().view(1, -1, 1, 1) + (z.float() if with_z else 0)).half()
            got = epilogue.finish(y0.clone(), b, z)
            err = float((got.float() - ref.float()).abs().max())
            y = y0.clone()
            oh, og = timed(functools.partial(epilogue.finish, y, b, z))
            th, tg = timed(functools.partial(torch_ops, y, b, z))
            rows.append({"shape": shape, "residual": with_z, "max_err": err, "ours_host_us": oh, "ours_gpu_us": og,
                         "torch_host_us": th, "torch_gpu_us": tg})
            print(f"{'x'.join(map(str, shape)):20} {int(with_z):>2} {err:9.2e} {oh:12.1f} {og:11.1f} {th:13.1f} {tg:12.1f}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "epilogue_probe.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": epilogue.triton_available(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
