"""Is the machine quiet enough to trust a comparison of times?

On a loaded machine (another busy process, or the search compiling the next candidate while one
is timed) PyTorch's multi-threaded CPU ops slow down by orders of magnitude while a
single-threaded kernel barely does, so a speedup measured then is fiction. Three signals say so:

* a calibration workload (a fixed multi-threaded elementwise op on the CPU, a fixed copy on the
  GPU), timed before and after a measurement, runs slower than the best this process has seen;
* the spread of the samples (inter-quartile range over the median) is large, beyond what the
  timer's own resolution explains;
* eager PyTorch runs slower than when the card was profiled.

``Verdict`` collects which signals fired. The profiler retries a measurement with any and, if it
stays loud, marks the time untrustworthy. The evaluator compares eager and a candidate with
paired samples, which cancel load that holds (``evaluator.timing_protocol.TimedEvaluation.time``): there these
signals choose the protocol (one thread each on a busy CPU) and are reported beside the verdict.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .timing import Stats, Timer


class Calibration:
    """A fixed workload, timed the way candidates are timed. Its best time is remembered per
    machine (device, threads) in the cache folder, so that a process started on a busy machine
    still knows what quiet looks like."""

    def __init__(self, device: str, timer: "Timer") -> None:
        import torch

        self.device = device
        self.timer = timer
        self.threads = torch.get_num_threads() if device == "cpu" else 0
        """The thread count its best is for (part of ``key``): it is measured with that many, whatever
        the caller's torch has at the moment (the evaluator times a busy machine on one thread)."""
        n = (16 << 20) // 4 if device == "cuda" else (4 << 20) // 4
        self._src = torch.rand(n, device=device)
        self._dst = torch.empty_like(self._src)
        self.key = self._key()
        self.best_us: float | None = self._load()
        self.history: list[float] = []
        for _ in range(2):  # the first runs of a fresh process are slow (caches, thread pools)
            self.measure()
        self.history.clear()

    def _key(self) -> str:
        import torch

        from .roofline import device_key

        return f"{device_key(self.device)}|threads{torch.get_num_threads() if self.device == 'cpu' else 0}"

    @staticmethod
    def _path() -> Path:
        from .roofline import cache_dir

        return cache_dir() / "calibration.json"

    def _load(self) -> float | None:
        try:
            return float(json.loads(self._path().read_text())[self.key])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save(self) -> None:
        path = self._path()
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        if self.key in data and isinstance(data[self.key], (int, float)) and data[self.key] <= (self.best_us or 0):
            return
        data[self.key] = self.best_us
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs the memory across processes

    def _run(self) -> None:
        import torch

        torch.mul(self._src, 1.0001, out=self._dst)

    def measure(self, n: int = 7) -> float:
        """Median of n timed runs (µs) on the thread count its best is for; lowers the remembered
        best when it is faster."""
        import torch

        was = torch.get_num_threads()
        if self.device == "cpu" and was != self.threads:
            torch.set_num_threads(self.threads)
            try:
                return self.measure(n)
            finally:
                torch.set_num_threads(was)
        samples = []
        self._run()
        for _ in range(n):
            if self.device == "cuda":
                samples.append(self.timer._one_cuda(self._run))
            else:
                t0 = time.perf_counter_ns()
                self._run()
                samples.append((time.perf_counter_ns() - t0) / 1000.0)
        med = float(statistics.median(samples))
        self.history.append(med)
        if self.best_us is None or med < self.best_us:
            self.best_us = med
            self._save()
        return med

    def loaded(self, value_us: float, max_slowdown: float = 1.5) -> str | None:
        """Why ``value_us`` says the machine is loaded, or None."""
        if self.best_us and value_us > max_slowdown * self.best_us:
            return (f"the calibration workload ran {value_us / self.best_us:.1f}x slower than its best "
                    f"({value_us:.1f} µs against {self.best_us:.1f} µs): the machine is busy")
        return None


def oversubscription() -> float | None:
    """Threads ready to run on this machine now, over the CPUs this process may use (Linux's
    ``/proc/loadavg``, whose fourth field counts them at the instant it is read, this process's
    own included); None where it cannot be read. Above 1, some of them wait for a CPU.

    A CPU-bound process beside the timed one hides from the calibration workload on some machines
    (on a small VM, busy-looping processes beside it can leave the calibration as fast as ever
    while a profiled forward runs far slower and would be trusted): the count of runnable threads
    sees it."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        return None
    return running / max(cpus, 1)


def oversubscribed_reason(factor: float | None, max_slowdown: float) -> str | None:
    """Why a host whose runnable threads outnumber its CPUs by ``factor`` is too busy to trust a
    CPU timing (more than ``max_slowdown``, the slowdown the calibration check tolerates), or None."""
    if factor is not None and factor > max_slowdown:
        return (f"{factor:.1f}x as many threads ready to run as CPUs: the machine is busy")
    return None


@dataclass
class Verdict:
    reasons: list[str] = field(default_factory=list)

    @property
    def quiet(self) -> bool:
        return not self.reasons

    def add(self, reason: str | None) -> None:
        if reason:
            self.reasons.append(reason)


def spread_reason(name: str, stats: "Stats", max_spread: float, resolution_us: float) -> str | None:
    """Why ``stats`` (timing.Stats) are too spread to trust, or None."""
    iqr = stats.q3 - stats.q1
    allowed = max(max_spread * stats.median, 2.0 * resolution_us)
    if iqr > allowed:
        return (f"{name}'s samples spread {100 * stats.spread:.0f}% (IQR {iqr:.1f} µs on a median of "
                f"{stats.median:.1f} µs; at most {100 * max_spread:.0f}% is trusted)")
    return None


def profile_reason(eager_us: float, profiled_us: float | None, resolution_us: float,
                   factor: float = 3.0) -> str | None:
    """Why eager's time now disagrees with the card's profiled time, or None. Only slower counts:
    a profile taken on a loaded machine is the profile's problem, not this measurement's. The
    factor is loose: a small card's eager time legitimately moves with the cache state of the
    inputs (the profile times one input set again and again, the evaluator fresh ones); a busy
    machine slows multi-threaded eager by far more."""
    if not profiled_us:
        return None
    slack = max(5.0, 3.0 * resolution_us)
    if eager_us > factor * profiled_us + slack:
        return (f"eager PyTorch ran {eager_us:.1f} µs where the card was profiled at {profiled_us:.1f} µs: "
                "the machine is busier than when it was profiled")
    return None
