"""The device's two ceilings, measured once per device and cached.

Bandwidth: a large device-to-device copy, counting bytes read plus bytes written. Peak compute:
a large matrix product per dtype. The floor of a card is max(bytes / bandwidth, flops / peak).

On the CPU, a card whose bytes fit in a cache level runs faster than DRAM allows (the evaluator
does not flush CPU caches), so the CPU ceiling also holds a bandwidth curve: copy bandwidth for
buffers from 16 KiB to 256 MiB, and a card's floor uses the fastest level its bytes could sit in.
``bandwidth_Bps`` stays the DRAM figure (the largest buffer), for display. CUDA ceilings have no
curve: the evaluator flushes L2 between timed runs there.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
from pathlib import Path

CACHE_VERSION = 2
"""2: CPU ceilings carry ``bandwidth_curve`` (best-of copy bandwidth per buffer size)."""

CPU_COPY_SIZES = tuple((16 << 10) << (2 * k) for k in range(8))
"""Buffer sizes of the CPU bandwidth curve: 16 KiB, 64 KiB, ... 256 MiB (powers of 4)."""
LARGE_COPY_BYTES = 32 << 20


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


def _best_per_call(fn, inner: int, trials: int) -> float:
    """Seconds per call of ``fn``: the best of ``trials`` samples of ``inner`` back-to-back calls."""
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def copy_curve(sizes=CPU_COPY_SIZES, *, trials: int = 7, sample_s: float = 2e-4) -> dict:
    """CPU copy bandwidth (bytes read + written per second) for each buffer size in ``sizes``.

    Each size is timed with torch's own copy, with all of torch's threads (as eager uses them) and,
    for buffers under LARGE_COPY_BYTES, also with one thread: a multi-threaded copy waits for any
    core another process holds, and one thread's cache bandwidth is bandwidth a kernel can reach
    too; the faster counts. One sample is a warm-up copy, then enough back-to-back copies to last
    ``sample_s``; the best of ``trials`` samples counts, so a momentarily loaded machine does not
    lower the ceiling. Buffers under LARGE_COPY_BYTES are sampled in rounds (one sample of every
    size per round), so a disturbance of a few milliseconds spoils one round, not every sample of
    a size; larger ones (tens of ms per copy) get 3 samples each, one at a time. The fixed cost of
    a copy call (timed on a 16-element copy) is taken off, at most half of a call's time, so the
    small buffers measure the cache and not the dispatch.

    Returns {"curve": [[size_bytes, bandwidth_Bps], ...] in increasing size, "call_overhead_s": ...}.
    """
    import torch

    a, b = torch.ones(16), torch.empty(16)
    b.copy_(a)
    overhead = _best_per_call(functools.partial(b.copy_, a), 200, 5)

    def prepare(n_bytes: int):
        src = torch.ones(max(n_bytes // 4, 1), dtype=torch.float32)
        dst = torch.empty_like(src)
        call = functools.partial(dst.copy_, src)
        t0 = time.perf_counter()
        call()  # touches dst's pages
        call()
        one = max((time.perf_counter() - t0) / 2, 1e-9)
        return src.numel() * 4, call, max(1, min(10000, int(sample_s / one)))

    def sample(call, inner: int) -> float:
        call()
        return _best_per_call(call, inner, 1)

    best: dict[int, float] = {}
    small = [prepare(n) for n in sorted(sizes) if n < LARGE_COPY_BYTES]
    threads = torch.get_num_threads()
    for k in (threads, 1) if threads > 1 else (1,):
        # one thread too: its copies do not wait on a core that another process holds
        torch.set_num_threads(k)
        try:
            for _ in range(trials):
                for n_bytes, call, inner in small:
                    best[n_bytes] = min(best.get(n_bytes, math.inf), sample(call, inner))
        finally:
            torch.set_num_threads(threads)
    del small
    for n_bytes in sorted(sizes):
        if n_bytes >= LARGE_COPY_BYTES:
            n, call, inner = prepare(n_bytes)
            best[n] = min(sample(call, inner) for _ in range(min(trials, 3)))
            del call
    curve = []
    for n_bytes, t in sorted(best.items()):
        t = max(t - overhead, 0.5 * t)
        curve.append([n_bytes, 2 * n_bytes / t])
    return {"curve": curve, "call_overhead_s": overhead}


def measure(device: str) -> dict:
    """Copy bandwidth (bytes/s, read+write) and matmul peak (flop/s) per dtype; on the CPU also the
    bandwidth curve over buffer sizes (``bandwidth_curve``; ``bandwidth_Bps`` is its DRAM end)."""
    import torch

    if device != "cuda":
        threads = torch.get_num_threads()
        torch.set_num_threads(max(threads, os.cpu_count() or 1))  # all cores, whatever a caller pinned
        try:
            return _measure_cpu()
        finally:
            torch.set_num_threads(threads)
    n_bytes, reps, mm = 2 << 30, 20, {"float32": 8192, "float16": 8192, "bfloat16": 8192}
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = _median_time(functools.partial(dst.copy_, src), device, reps)
    bandwidth = 2 * n_bytes / t
    del src, dst
    return {"bandwidth_Bps": bandwidth, "peak_flops": _peaks(device, mm, reps), "device_name": device_name(device),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "method": {
                "copy_bytes": n_bytes, "matmul_n": mm, "reps": reps}}


def _measure_cpu() -> dict:
    reps, mm = 5, {"float32": 1024, "float16": 256, "bfloat16": 512}
    copies = copy_curve()
    curve = copies["curve"]
    return {"bandwidth_Bps": curve[-1][1], "bandwidth_curve": curve, "peak_flops": _peaks("cpu", mm, reps),
            "device_name": device_name("cpu"), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "method": {
                "copy_bytes": curve[-1][0], "curve_sizes": [c[0] for c in curve], "best_of": 7,
                "call_overhead_s": copies["call_overhead_s"], "matmul_n": mm, "reps": reps}}


def _peaks(device: str, mm: dict, reps: int) -> dict:
    import torch

    peak = {}
    for name, n in mm.items():
        dt = getattr(torch, name)
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        product = functools.partial(torch.mm, a, b)
        if device == "cuda":
            t = _median_time(product, device, max(3, reps // 2))
        else:  # the best of a few: a momentarily loaded machine must not lower the ceiling
            product()
            t = _best_per_call(product, 1, max(3, reps // 2))
        peak[name] = 2 * n**3 / t
    return peak


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


def bandwidth_for(bytes_moved: int, ceil: dict) -> float:
    """The bandwidth a card moving ``bytes_moved`` (read + written) can reach: with a CPU curve, the
    highest measured for any buffer of at least bytes_moved / 2 (a copy of such a buffer moves as
    many bytes: the fastest cache level the card's bytes could sit in); else ``bandwidth_Bps``."""
    bw = ceil["bandwidth_Bps"]
    fits = [b for size, b in ceil.get("bandwidth_curve") or () if size >= bytes_moved / 2]
    return max([bw, *fits])


def peak_for(dtype: str, ceil: dict) -> float:
    """The compute ceiling (flop/s) of a card of ``dtype``: the dtype's measured matrix-product
    peak, or float32's where that is higher. A kernel may always compute in float32 and round once:
    on a CPU without half-precision arithmetic (no AVX512-BF16 or FP16) torch's bf16 and fp16
    products run at a few percent of float32's, and a floor from that peak is longer than what an
    elementwise half-precision kernel, eager included, takes."""
    peaks = ceil["peak_flops"]
    return max(peaks.get(dtype) or 0.0, peaks["float32"])


def floor_terms(bytes_moved: int, flops: int, dtype: str, ceil: dict) -> tuple[float, float]:
    """(memory bound, compute bound) of a card, in µs: bytes over the bandwidth its bytes could
    reach, flops over ``peak_for`` its dtype."""
    return bytes_moved / bandwidth_for(bytes_moved, ceil) * 1e6, flops / peak_for(dtype, ceil) * 1e6


def floor_us(bytes_moved: int, flops: int, dtype: str, ceil: dict) -> float:
    return max(floor_terms(bytes_moved, flops, dtype, ceil))


def floor_under(eager_us: float, bytes_moved: int, flops: int, dtype: str, ceil: dict) -> float:
    """The floor as the judge applies it, given eager's fastest measured call (µs): a bound that
    eager itself beats comes from a ceiling that is not one on this machine for this card (a peak
    measured on another kind of work, a bandwidth level the card's bytes reach faster), so it is
    left out; the floor is the largest bound eager does not beat (0 where it beats both)."""
    return max([t for t in floor_terms(bytes_moved, flops, dtype, ceil) if t <= eager_us], default=0.0)
