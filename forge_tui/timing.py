"""Timing that can be trusted: warm-up, cold L2, device-wide synchronisation, many runs, medians.

One implementation serves the profiler (operator cards) and the evaluator (candidates), so a
card's measured time and a candidate's are taken the same way and their ratio is meaningful.

A sample is the host clock from the moment the callable is called to the moment the device is
idle: on CUDA the L2 is flushed first (a write over a buffer larger than the cache), the device
is synchronised, the clock starts, the callable runs, the whole device is synchronised again
(work a callable sends to any stream is counted), and the clock stops. Launch overhead is part
of the sample, for eager PyTorch and for a candidate alike. The same protocol timed around an
empty callable, interleaved with the others, measures the fixed cost of the protocol itself
(the synchronisation), which is reported and subtracted. CPU: the host clock around the call.

Several callables are timed interleaved (run i of each before run i+1 of any), so drift in clocks
or temperature hits all of them alike and their ratios are paired.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Stats:
    """Times in microseconds."""

    median: float
    mean: float
    min: float
    max: float
    q1: float
    q3: float
    n: int

    @property
    def spread(self) -> float:
        """Relative inter-quartile range: (q3 - q1) / median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["spread"] = self.spread
        return d

    @classmethod
    def from_samples(cls, samples: list[float]) -> "Stats":
        s = sorted(samples)
        n = len(s)
        if n == 1:
            q1 = q3 = s[0]
        else:
            qs = statistics.quantiles(s, n=4, method="inclusive")
            q1, q3 = qs[0], qs[2]
        return cls(median=statistics.median(s), mean=statistics.fmean(s), min=s[0], max=s[-1],
                   q1=q1, q3=q3, n=n)


def paired_ratio(num: list[float], den: list[float]) -> Stats:
    """Per-run ratios num[i] / den[i] of interleaved samples (a speedup when num is the baseline)."""
    return Stats.from_samples([a / b for a, b in zip(num, den) if b > 0])


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """An interval that holds the median of the distribution the values were drawn from with at
    least ``confidence``, whatever that distribution: the order statistics x(k) and x(n+1-k) for
    the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. No normality is assumed (a
    loaded machine's samples are heavy-tailed: most near the true time, a few many times longer).
    Below 6 values no k qualifies at 95%: the interval is the whole range."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan, math.nan
    scale = 1 << 20
    tail = int((1 - confidence) / 2 * scale)  # compared exactly: sum of C(n, j) * scale against tail * 2^n
    total, k, cum = 1 << n, 0, 0
    for j in range(n + 1):
        cum += math.comb(n, j)
        if cum * scale > tail * total:
            break
        k = j + 1
    if k < 1:
        return s[0], s[-1]
    return s[k - 1], s[n - k]


@dataclass(frozen=True)
class RatioCheck:
    """What paired ratios (eager's time over the candidate's, sample by sample) say: their median,
    its 95% interval, and the same for the first and the second half of the samples (in the order
    they were taken)."""

    median: float
    lo: float
    hi: float
    n: int
    halves: tuple[tuple[float, float, float], tuple[float, float, float]]
    """(median, lo, hi) of the first half, then of the second."""

    @property
    def width(self) -> float:
        """The interval's width over the median (inf where there is no median)."""
        return (self.hi - self.lo) / self.median if self.median > 0 else math.inf

    def moved(self, max_width: float) -> bool:
        """Whether the ratio moved between the halves: their intervals do not overlap and their
        medians are further apart than ``max_width`` of the median. Paired samples cancel load that
        hits eager and the candidate alike, however heavy, as long as it holds; a ratio that moves
        says the load changed during the measurement (it came or went between eager's sample and
        the candidate's, or hit one side harder from some point on)."""
        (m1, lo1, hi1), (m2, lo2, hi2) = self.halves
        apart = hi1 < lo2 or hi2 < lo1
        return apart and abs(m1 - m2) > max_width * self.median

    def to_json(self) -> dict:
        return {"median": self.median, "interval": [self.lo, self.hi], "n": self.n, "width": self.width,
                "halves": [list(h) for h in self.halves]}


def ratio_check(ratios: list[float], confidence: float = 0.95) -> RatioCheck:
    """``RatioCheck`` of paired ratios, in the order they were measured."""
    def part(xs: list[float]) -> tuple[float, float, float]:
        if not xs:
            return math.nan, math.nan, math.nan
        lo, hi = median_interval(xs, confidence)
        return float(statistics.median(xs)), lo, hi

    half = len(ratios) // 2
    med, lo, hi = part(ratios)
    return RatioCheck(median=med, lo=lo, hi=hi, n=len(ratios), halves=(part(ratios[:half]), part(ratios[half:])))


ORDER_SEED = 0x5EED
"""The seed of the interleaved rounds' orders (the same orders in every run)."""


SLEEP_CYCLES = 2_000_000
"""``torch.cuda._sleep``'s cycles before a call timed on the device alone (about 1 ms at a
data-centre GPU's clock of about 2 GHz, longer than one call's host): the device waits while the host enqueues the call. Where
the host enqueues more (a sample of many calls), the caller asks for longer: a sleep that ends
before the host does leaves the device idle between the calls, and that idle time is counted."""


class Timer:
    """Times callables on one device with the protocol above."""

    def __init__(self, device: str, *, warmup: int = 3, repeats: int = 20, cold_l2: bool = True,
                 flush_mib: int = 256) -> None:
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.cold_l2 = cold_l2 and device == "cuda"
        self._flush = None
        self.overhead_iqr_us = 0.0
        """Inter-quartile range of the empty callable's samples in the last ``time`` call: how
        finely this protocol resolves a time."""
        if self.cold_l2:
            import torch

            self._flush = torch.empty(flush_mib * (1 << 20) // 4, dtype=torch.float32, device="cuda")

    @classmethod
    def from_config(cls, device: str, cfg) -> "Timer":
        return cls(device, warmup=cfg.warmup, repeats=cfg.repeats, cold_l2=cfg.cold_l2, flush_mib=cfg.flush_mib)

    def describe(self) -> dict:
        return {"device": self.device, "warmup": self.warmup, "repeats": self.repeats,
                "cold_l2": self.cold_l2,
                "clock": "host clock from the call to the device idle" if self.device == "cuda" else "host clock"}

    def prepare(self) -> None:
        """What precedes the clock's start: the L2 flush and a device-wide synchronisation."""
        if self.device == "cuda":
            import torch

            if self._flush is not None:
                self._flush.zero_()
            torch.cuda.synchronize()

    def _one_cuda(self, fn: Callable[[], object]) -> float:
        import torch

        self.prepare()
        t0 = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1000.0

    def device_us(self, fn: Callable[[], object], sleep_cycles: int = SLEEP_CYCLES) -> float:
        """CUDA: the device's time for what ``fn`` enqueues (µs), without its host. The L2 is
        flushed, the device is held busy (``torch.cuda._sleep``) while the host enqueues the call,
        and CUDA events on the current stream around the call time the work alone: a callable
        whose host costs tens of µs a call (torch.compile's guards and wrappers) is charged what
        its kernels cost where a compiled model calls them, one graph's launches among many."""
        import torch

        if self._flush is not None:
            self._flush.zero_()
        torch.cuda._sleep(sleep_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0

    @staticmethod
    def _one_cpu(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1000.0

    def run_interleaved(self, fns: Mapping[str, Callable[[], object]], *,
                        after_each: Callable[[str, int], object] | None = None,
                        before_each: Callable[[str, int], object] | None = None) -> dict[str, list[float]]:
        """Raw per-run samples (µs) for every callable, interleaved. ``before_each(name, i)`` and
        ``after_each(name, i)`` run around timed run i of ``name``, outside the timed region (to
        rotate input contents, poison outputs, check results). Warm-up run w is prepared by
        ``before_each(name, -1 - w)`` too, so a warm-up sees the same state as a timed run."""
        one = self._one_cuda if self.device == "cuda" else self._one_cpu
        for w in range(self.warmup):
            for name, fn in fns.items():
                if before_each is not None:
                    before_each(name, -1 - w)
                fn()
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        # rounds in pairs: an order drawn from a fixed seed, then the same order reversed, so that
        # over every two rounds each variant runs before and after each other one equally often and
        # first as often as last. In a fixed order (or one rotated a place a round) a variant nearly
        # always follows the same one, and the place alone sets two copies of the same forward
        # apart by more than the differences being measured (docs/evaluator.md).
        order = random.Random(ORDER_SEED)
        for i in range(self.repeats):
            if i % 2 == 0:
                order.shuffle(names)
            else:
                names.reverse()
            for name in list(names):
                fn = fns[name]
                if before_each is not None:
                    before_each(name, i)
                samples[name].append(one(fn))
                if after_each is not None:
                    after_each(name, i)
        return samples

    def time(self, fns: Mapping[str, Callable[[], object]], *, subtract_overhead: bool = True,
             after_each: Callable[[str, int], object] | None = None,
             before_each: Callable[[str, int], object] | None = None,
             ) -> tuple[dict[str, Stats], dict[str, list[float]], float]:
        """Stats per callable, per-run samples, and the measured per-run overhead (µs).

        With ``subtract_overhead`` (CUDA only) an empty callable is timed interleaved with the
        others and its median is subtracted from every sample (never below zero).
        """
        fns = dict(fns)
        measure_overhead = subtract_overhead and self.device == "cuda"
        if measure_overhead:
            fns["__empty__"] = lambda: None
        raw = self.run_interleaved(
            fns,
            after_each=None if after_each is None else (lambda n, i: n != "__empty__" and after_each(n, i)),
            before_each=None if before_each is None else (lambda n, i: n != "__empty__" and before_each(n, i)))
        overhead = 0.0
        self.overhead_iqr_us = 0.0
        if measure_overhead:
            empty = Stats.from_samples(raw.pop("__empty__"))
            overhead, self.overhead_iqr_us = empty.median, empty.q3 - empty.q1
        if overhead:
            raw = {name: [max(v - overhead, 0.0) for v in s] for name, s in raw.items()}
        stats = {name: Stats.from_samples(s) for name, s in raw.items()}
        return stats, raw, overhead
