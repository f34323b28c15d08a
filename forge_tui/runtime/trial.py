"""The in-place trial: a site's first calls timed with the kernel's path and with PyTorch's."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def median_us(ns: list[int]) -> float:
    return sorted(ns)[len(ns) // 2] / 1000.0


class Trial:
    """The in-place check that a kernel pays where it runs: a site's first calls alternate between
    the kernel's path and PyTorch's, each timed (the device synchronised on CUDA, so a call's time
    is its latency: host work, launches and the kernels); once ``calls`` of each are timed (after
    one untimed warm-up each), the kernel stays only if its median is lower. Timings in a model
    include what isolation misses: cold caches, the guard, the allocator, the interpreter.

    Both paths give correct results, so no call is wasted. Skipped (the kernel path runs untimed)
    while torch.compile traces or a CUDA graph captures."""

    def __init__(self, calls: int, device: str, decide: Callable[[float, float, int], None]) -> None:
        self.calls = calls
        self.device = device
        self.decide = decide
        self.samples: dict[bool, list[int]] = {True: [], False: []}
        self.seen = {True: 0, False: 0}
        self.done = calls <= 0
        self._lock = threading.Lock()
        self._next = True

    def pending(self) -> bool:
        if self.done:
            return False
        import torch

        if torch.compiler.is_compiling():
            return False
        return not (self.device == "cuda" and torch.cuda.is_current_stream_capturing())

    def time_call(self, fn: Callable[[], Any], with_kernel: bool) -> tuple[Any, int]:
        """(fn's result, its wall time in ns, the device synchronised before and after)."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter_ns() - t0

    def run(self, with_kernel: Callable[[], Any], without: Callable[[], Any]) -> Any:
        with self._lock:
            side = self._next
            self._next = not side
        out, ns = self.time_call(with_kernel if side else without, side)
        decision = None
        with self._lock:
            if self.done:
                return out
            self.seen[side] += 1
            if self.seen[side] > 1:  # the first call of each path is its warm-up
                self.samples[side].append(ns)
            if all(len(v) >= self.calls for v in self.samples.values()):
                self.done = True
                med = {k: median_us(v) for k, v in self.samples.items()}
                decision = (med[True], med[False], self.calls)
        if decision is not None:
            self.decide(*decision)
        return out
