"""The device's two ceilings, measured once per device and cached.

Bandwidth: a large device-to-device copy, counting bytes read plus bytes written. Peak compute:
a large matrix product per dtype. The floor of a card is max(bytes / bandwidth, flops / peak).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from pathlib import Path

CACHE_VERSION = 1


def cache_dir() -> Path:
    root = os.environ.get("FORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forge-tui")
    return Path(root)


def device_key(device: str) -> str:
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name()
        cc = "%d.%d" % torch.cuda.get_device_capability()
        return f"cuda|{name}|sm{cc}|torch{torch.__version__}"
    return f"cpu|{platform.machine()}|{platform.processor() or 'cpu'}|{os.cpu_count()}cores|torch{torch.__version__}"


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def _median_time(fn, device: str, reps: int) -> float:
    import torch

    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def measure(device: str) -> dict:
    """Copy bandwidth (bytes/s, read+write) and matmul peak (flop/s) per dtype."""
    import torch

    if device == "cuda":
        n_bytes, reps, mm = 2 << 30, 20, {"float32": 8192, "float16": 8192, "bfloat16": 8192}
    else:
        n_bytes, reps, mm = 256 << 20, 5, {"float32": 1024, "float16": 256, "bfloat16": 512}
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = _median_time(functools.partial(dst.copy_, src), device, reps)
    bandwidth = 2 * n_bytes / t
    del src, dst
    peak = {}
    for name, n in mm.items():
        dt = getattr(torch, name)
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        t = _median_time(lambda: torch.mm(a, b), device, max(3, reps // 2))
        peak[name] = 2 * n**3 / t
    return {"bandwidth_Bps": bandwidth, "peak_flops": peak, "device_name": device_name(device),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "method": {
                "copy_bytes": n_bytes, "matmul_n": mm, "reps": reps}}


def ceilings(device: str, *, refresh: bool = False) -> dict:
    """Cached ceilings of this device (measured on first use)."""
    key = device_key(device)
    path = cache_dir() / "ceilings.json"
    data: dict = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    if data.get("version") != CACHE_VERSION:
        data = {"version": CACHE_VERSION, "devices": {}}
    if refresh or key not in data["devices"]:
        data["devices"][key] = measure(device)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    return data["devices"][key]


def floor_us(bytes_moved: int, flops: int, dtype: str, ceil: dict) -> float:
    peak = ceil["peak_flops"].get(dtype) or ceil["peak_flops"]["float32"]
    return max(bytes_moved / ceil["bandwidth_Bps"], flops / peak) * 1e6
