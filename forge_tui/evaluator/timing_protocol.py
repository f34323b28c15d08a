"""The judge's timing protocol: eager, torch.compile and the candidate timed in paired,
interleaved samples, each call on fresh inputs and checked, until the speedup's interval is tight
(``TimedEvaluation.time``); and the verdict a correct candidate gets from its timing."""

from __future__ import annotations

import functools
import math
import time
from typing import Callable

from .. import roofline
from ..inputs import DISTRIBUTIONS, fresh_inputs_into
from ..program import bind_program, compile_source, first_compiled_call
from ..quiet import Calibration, Verdict, oversubscribed_reason, oversubscription, profile_reason, spread_reason
from ..timing import SLEEP_CYCLES, Stats, Timer, ratio_check
from .accused import CandidateProcessError
from .checks import CheckedEvaluation
from .harness import WORKSPACE_POISON, CandidateFailure, FatalDeviceError, as_bytes, fill_poison


def impossible_time(median_us: float, floor_us: float, resolution_us: float) -> bool:
    """A measured time under 90% of the roofline floor cannot be right, unless the floor itself is
    within the timer's resolution (the spread of its own overhead): a kernel of a few hundred
    bytes measures 0.00 µs once the median overhead is subtracted, and rejecting it would reject a
    correct candidate on noise (its outputs are still checked after every timed run)."""
    return median_us < 0.9 * floor_us and floor_us > resolution_us


def _paired(num: list[float], den: list[float], resolution: float) -> list[float]:
    """Paired ratios num[i] / den[i]; a time under the timer's resolution counts as the resolution
    (a candidate faster than the clock can tell gets a bounded speedup, not an infinite one)."""
    floor = max(resolution, 1e-3)
    return [max(a, floor) / max(b, floor) for a, b in zip(num, den)]


def _ratio(num: list[float], den: list[float], resolution: float) -> dict:
    """Stats of the paired ratios num[i] / den[i] (``_paired``)."""
    return Stats.from_samples(_paired(num, den, resolution)).to_json()



def timing_verdict(timing: dict | None) -> tuple[str, str, str | None]:
    """(status, reason, failure) of a correct candidate by its timing: rejected for a time under
    the floor, noisy where the speedup could not be trusted, passed otherwise (and without timing)."""
    if timing and timing["impossible"]:
        return "rejected", (f"measured {timing['candidate']['median']:.2f} µs, under 90% of the roofline floor "
                            f"{timing['floor_us']:.2f} µs: impossible, so the measurement or the candidate is "
                            "wrong"), "impossible_time"
    if timing and not timing["quiet"]:
        return "noisy", ("correct, but the machine was too busy to trust the timing: "
                         + "; ".join(timing["noisy_reasons"][:3])), None
    return "passed", "", None


class TimedEvaluation(CheckedEvaluation):
    """A checked evaluation that also times the candidate: the baselines, the timer, the
    calibration and ``time``."""

    def compiled_baseline(self):
        """torch.compile of the reference, cached per card in this process; None if it fails."""
        mode = self.opt.compile_baseline
        if mode is False or (mode == "auto" and self.device != "cuda"):
            return None, "not requested on this backend"
        cache = self.state.setdefault("compiled", {})
        key = self.card.id
        if key not in cache:
            import torch

            fn = compile_source(self.card.program, len(self.card.inputs))
            try:
                self.phase("compile-baseline")
                cache[key] = (torch.compile(fn, dynamic=False), None)
            except Exception as exc:  # noqa: BLE001
                cache[key] = (None, f"{type(exc).__name__}: {exc}")
        return cache[key]

    def _timer(self) -> Timer:
        key = ("timer", self.device, self.tcfg.cold_l2, self.tcfg.flush_mib)
        if key not in self.state:
            self.state[key] = Timer(self.device, warmup=0, repeats=1, cold_l2=key[2], flush_mib=key[3])
        return self.state[key]

    def _calibration(self, timer: Timer) -> Calibration:
        key = ("calibration", self.device)
        if key not in self.state:
            self.state[key] = Calibration(self.device, timer)
        return self.state[key]

    def _one(self, timer: Timer, fn: Callable[[], object], what: str = "") -> float:
        """One baseline sample (µs) of ``what`` ("eager", "compile" or "empty") on the timer's
        protocol, or on this thread's CPU clock (``clock`` "cpu": eager runs on this thread then)."""
        if self.device == "cuda":
            return timer._one_cuda(fn)
        now = time.thread_time_ns if self.clock == "cpu" else time.perf_counter_ns
        t0 = now()
        fn()
        return (now() - t0) / 1000.0

    def floor_us(self, ceil: dict) -> float:
        """The card's roofline floor on this device (µs)."""
        return roofline.floor_us(self.card.bytes, self.card.flops, self.card.dtype, ceil)

    HEARTBEAT_S = 1.0
    """At most this long between two progress messages to the client while timing: a long
    protocol (many repeats, a loaded machine sampling more) is never taken for a hang."""

    def beat(self, force: bool = False) -> None:
        """A progress message to the client (the current phase again), at most every HEARTBEAT_S."""
        now = time.monotonic()
        if force or now - self._last_beat >= self.HEARTBEAT_S:
            self._last_beat = now
            self.phase(self.current_phase)

    def busy(self, cal: Calibration, cal_us: float, max_slowdown: float) -> list[str]:
        """Why the machine is busy now (the calibration workload slow, or more threads ready to run
        than CPUs), or nothing."""
        return [r for r in (cal.loaded(cal_us, max_slowdown), oversubscribed_reason(oversubscription(), 1.0)) if r]

    def time(self, ceil: dict) -> dict:
        """Eager, torch.compile (where asked for) and the candidate, timed in paired, interleaved
        samples: in each round eager's sample is taken while the runner is frozen, then the
        candidate's, each call on fresh inputs and checked.

        Load delays the verdict; it does not deny it. Paired samples cancel load that slows eager
        and the candidate alike, however heavy, as long as it holds: the speedup is the median of
        the per-sample ratios, and the samples go on, in steps, from 2 x repeats up to
        ``max_samples``, until that median's 95% interval (``timing.median_interval``, free of any
        assumption on the distribution) is within ``max_spread`` of it. On the CPU a busy machine
        (the calibration workload slow, or more threads ready to run than CPUs) has eager and the
        candidate timed on one thread each, on the CPU time the kernel counts (eager's thread's; the
        runner's process's, every thread's, those that exited included: ``Accused.timed_call``): a
        parallel region waits for its slowest thread, which on an oversubscribed machine waits for a
        CPU, and a call to the runner waits for the runner to be scheduled, which eager, in this
        process, never does; on the wall clock samples would measure the scheduler.
        ``noisy`` remains for a ratio whose interval never tightens, or that moves between the
        first and the second half of the samples (the load changed during the measurement), after
        ``noisy_retries`` more attempts; a busy calibration, spreads and an eager slower than its
        profile are reported as notes."""
        import torch

        timer = self._timer()
        cal = self._calibration(timer)
        warmup, repeats = self.tcfg.warmup, self.tcfg.repeats
        retries = self.tcfg.noisy_retries
        max_width = self.tcfg.max_spread
        max_slowdown = self.tcfg.max_slowdown
        least = 2 * repeats
        most = max(least, self.tcfg.max_samples)
        step = max(2, repeats // 2)
        acc = self.acc
        # calls a sample: eager's time's count first, then the candidate's own (after each warm-up)
        K = min(acc.sets, self.calls_for(self.card.time_us))
        sized_by_us: float | None = None  # the warm-up's per-call time that last raised K
        eagers = [bind_program(self.card.program, ins, self.device) for ins in acc.batch_inputs]
        compiled, compile_note = self.compiled_baseline()
        if compiled is not None:
            try:
                self.phase("compile-baseline")
                acc.freeze()
                # compiled now, outside the timed warm-up (the first call only: the state keeps it)
                fresh = self.state.setdefault("compile_called", set())
                no_graph = None
                if self.card.id not in fresh:
                    fresh.add(self.card.id)
                    no_graph = first_compiled_call(compiled, *acc.inputs, device=self.device)
                compiled(*acc.inputs, device=self.device)
                self._sync()
                if no_graph:
                    compile_note = no_graph
                    self.state["compiled"][self.card.id] = (None, compile_note)
                    compiled = None
            except FatalDeviceError:
                raise
            except Exception as exc:  # noqa: BLE001
                compile_note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self.state["compiled"][self.card.id] = (None, compile_note)
                compiled = None
        tiny = torch.zeros(1, device=self.device)

        def overhead() -> tuple[float, float]:
            """The runner's empty round trip on the clock in use: (median, inter-quartile range)."""
            ns = acc.overhead_cpu_ns if self.clock == "cpu" else acc.overhead_ns
            ov = Stats.from_samples([x / 1000.0 for x in ns])
            return ov.median, ov.q3 - ov.q1

        runner_overhead, runner_res = overhead()
        gen = torch.Generator(self.device).manual_seed(self.seed + 104729)

        def run_eagers(box: list) -> None:
            box.extend(fn() for fn in eagers[:K])

        def run_compiled() -> None:
            for ins in acc.batch_inputs[:K]:
                compiled(*ins, device=self.device)

        def summarise(raw: dict[str, list[float]]) -> tuple[dict[str, list[float]], float]:
            """Per-call samples (µs) of every variant, overheads subtracted, and the resolution."""
            empty = Stats.from_samples(raw["empty"])
            resolution = max(runner_res, empty.q3 - empty.q1) / K
            samples = {"candidate": [max(x - runner_overhead, 0.0) / K for x in raw["candidate"]]}
            for name, xs in raw.items():
                if name == "compile_device":  # events on the device: no synchronisation to subtract
                    samples[name] = [x / K for x in xs]
                elif name not in ("candidate", "empty"):
                    samples[name] = [max(x - empty.median, 0.0) / K for x in xs]
            return samples, resolution

        threads, threads_note = self.threads, None
        torch_threads = torch.get_num_threads() if self.device == "cpu" else None
        if torch_threads is not None:
            torch.set_num_threads(threads)  # eager on as many threads as the candidate's OpenMP team
        self.phase("timing")
        attempts: list[dict] = []
        try:
            for attempt in range(1 + retries):
                self.beat(force=True)
                acc.freeze()
                cal_before = cal.measure()
                busy = self.busy(cal, cal_before, max_slowdown)
                if busy and self.device == "cpu" and self.clock == "wall" and acc.overhead_cpu_ns:
                    # one thread each, on CPU clocks: an oversubscribed machine's parallel region waits
                    # for its slowest thread, and a call to the runner for the runner to be scheduled
                    # (and its reply for the judge), which eager, in this process, never does; CPU
                    # time counts neither
                    if threads > 1:
                        threads = 1
                        torch.set_num_threads(1)
                        acc.thaw()  # a frozen runner answers no request
                        acc.set_threads(1)
                        acc.freeze()
                    self.clock = "cpu"
                    runner_overhead, runner_res = overhead()
                    threads_note = ("eager and the candidate timed on one thread each, on the CPU time the kernel "
                                    f"counts for them (not the time they waited for a CPU): {busy[0]}")
                raw: dict[str, list[float]] = {"candidate": [], "eager": [], "empty": []}
                if compiled is not None:
                    raw["compile"] = []
                    if self.device == "cuda":
                        raw["compile_device"] = []
                checked = 0
                ran_while_frozen = 0
                warm_ns: list[int] = []
                i = -warmup
                while True:
                    acc.freeze()
                    cpu0 = acc.cpu_ns()
                    draws = []
                    for k, ins in enumerate(acc.batch_inputs[:K]):
                        draws.append((gen.get_state(), (i + warmup + k) % len(DISTRIBUTIONS)))
                        fresh_inputs_into(self.card, ins, gen, draws[-1][1])
                    box: list = []
                    t_e = self._one(timer, functools.partial(run_eagers, box), "eager")
                    t_c = self._one(timer, run_compiled, "compile") if compiled is not None else None
                    # what torch.compile's kernels cost where a compiled model runs them (no guard, no
                    # wrapper): the device held busy twice the calls' latency just measured (at 2 GHz),
                    # so that the K calls' guards and launches are all enqueued under it
                    t_cd = (timer.device_us(run_compiled, sleep_cycles=max(SLEEP_CYCLES, int(4000 * (t_c or 0.0))))
                            if compiled is not None and self.device == "cuda" else None)
                    t_0 = self._one(timer, lambda: tiny.zero_(), "empty")
                    expected = [[o.clone() for o in outs] for outs in box]
                    cpu1 = acc.cpu_ns()
                    if cpu0 is not None and cpu1 is not None:
                        ran_while_frozen += cpu1 - cpu0
                    acc.thaw()
                    for outs in acc.batch_outputs[:K]:
                        for o in outs:
                            fill_poison(o, i % 2)
                    if acc.workspace is not None:
                        acc.workspace.fill_(WORKSPACE_POISON[i % 2])
                    timer.prepare()
                    if self.clock == "cpu":
                        used, rc = acc.timed_call(functools.partial(acc.call, 0, K))
                        if used is None:
                            raise CandidateProcessError("harness", "the runner's CPU time could not be read")
                        ns = used
                    else:
                        rc, ns = acc.call(0, K)
                    acc.freeze()
                    landed = [[as_bytes(o).clone() for o in outs] for outs in acc.batch_outputs[:K]]
                    if rc != 0:
                        raise CandidateFailure("returned_error", f"forge_launch returned {rc} in timed run {i}")
                    self.check_threads(f"timed run {i}")
                    for k in range(K):
                        where = f"timed run {i}" + (f", call {k + 1} of {K}" if K > 1 else "") + " (fresh inputs)"
                        self.spot_check(where, acc.batch_inputs[k], acc.batch_outputs[k], expected[k], i % 2,
                                        functools.partial(self.regenerated, acc.batch_inputs[k], *draws[k]))
                    self._sync()
                    for k, outs in enumerate(acc.batch_outputs[:K]):
                        for j, (o, before) in enumerate(zip(outs, landed[k])):
                            if not torch.equal(as_bytes(o), before):
                                raise CandidateFailure("late_writes", f"timed run {i}: output {j} changed after the "
                                                       "candidate reported it was done (work still running after the "
                                                       "call returned)")
                    checked += K
                    self.beat()
                    if i < 0:
                        warm_ns.append(ns)
                        if i == -1:
                            # the warm-up's fastest sample says what the candidate costs a call: enough
                            # calls that its own samples, not eager's, last the target (never fewer)
                            per_call = max(max(min(warm_ns) / 1000.0 - runner_overhead, 0.0) / K, 0.5)
                            grown = min(acc.sets, self.calls_for(per_call))
                            if grown > K:
                                K, sized_by_us = grown, per_call
                    else:
                        raw["candidate"].append(ns / 1000.0)
                        raw["eager"].append(t_e)
                        raw["empty"].append(t_0)
                        if t_c is not None:
                            raw["compile"].append(t_c)
                        if t_cd is not None:
                            raw["compile_device"].append(t_cd)
                    i += 1
                    n = len(raw["candidate"])
                    if n >= least and (n - least) % step == 0:
                        samples, resolution = summarise(raw)
                        check = ratio_check(_paired(samples["eager"], samples["candidate"], resolution))
                        if n >= most or (check.width <= max_width and not check.moved(max_width)):
                            break
                cal_after = cal.measure()
                samples, resolution = summarise(raw)
                stats = {name: Stats.from_samples(v) for name, v in samples.items()}
                check = ratio_check(_paired(samples["eager"], samples["candidate"], resolution))
                verdict, notes = Verdict(), Verdict()
                if check.width > max_width:
                    verdict.add(f"the speedup's 95% interval [{check.lo:.3f}, {check.hi:.3f}] stayed "
                                f"{100 * check.width:.0f}% of its median {check.median:.3f} after {check.n} paired "
                                f"samples (at most {100 * max_width:.0f}% is trusted)")
                if check.moved(max_width):
                    (m1, lo1, hi1), (m2, lo2, hi2) = check.halves
                    verdict.add(f"the load changed during the measurement: the speedup was {m1:.3f} [{lo1:.3f}, "
                                f"{hi1:.3f}] in the first half of the samples and {m2:.3f} [{lo2:.3f}, {hi2:.3f}] "
                                "in the second")
                if ran_while_frozen:
                    verdict.add(f"the candidate's process used {ran_while_frozen / 1e6:.3f} ms of CPU while it was "
                                "frozen for the baselines")
                for note in [cal.loaded(cal_before, max_slowdown), cal.loaded(cal_after, max_slowdown), *busy[1:]]:
                    notes.add(note)
                for name, st in stats.items():
                    notes.add(spread_reason(name, st, max_width, resolution))
                notes.add(profile_reason(stats["eager"].median, self.card.time_us, resolution, 2 * max_slowdown))
                attempts.append({"attempt": attempt, "quiet": verdict.quiet, "reasons": verdict.reasons,
                                 "notes": notes.reasons, "calibration_us": [cal_before, cal_after],
                                 "candidate_median_us": stats["candidate"].median,
                                 "eager_median_us": stats["eager"].median, "samples": check.n,
                                 "speedup_interval": [check.lo, check.hi], "threads": threads})
                if verdict.quiet:
                    break
        finally:
            acc.freeze()
            if torch_threads is not None:
                torch.set_num_threads(torch_threads)
        half = len(samples["candidate"]) // 2
        m1 = Stats.from_samples(samples["candidate"][:half] or samples["candidate"]).median
        m2 = Stats.from_samples(samples["candidate"][half:]).median
        noise = abs(m1 - m2) / min(m1, m2) if min(m1, m2) > 0 else 0.0
        cand_med = stats["candidate"].median
        # the floor as far as eager's own fastest call allows: a bound eager beats is no bound
        floor = roofline.floor_under(stats["eager"].min, self.card.bytes, self.card.flops, self.card.dtype, ceil)
        vs_compile = ("compile_device" if "compile_device" in samples
                      else "compile" if "compile" in samples else None)
        return {
            "candidate": stats["candidate"].to_json(), "eager": stats["eager"].to_json(),
            "compile": stats["compile"].to_json() if "compile" in stats else None,
            "compile_device": stats["compile_device"].to_json() if "compile_device" in stats else None,
            "compile_note": compile_note,
            "speedup_vs_eager": _ratio(samples["eager"], samples["candidate"], resolution),
            "speedup_interval": [check.lo, check.hi],
            # against torch.compile's kernels, not its call: the compiled baseline's device time
            # where there is a device (the candidate's sample keeps its launch: the ratio errs
            # against the candidate), its latency on the cpu
            "speedup_vs_compile": (_ratio(samples[vs_compile], samples["candidate"], resolution)
                                   if vs_compile else None),
            "compile_basis": {"compile_device": "device", "compile": "latency"}.get(vs_compile or ""),
            "speedup_vs_compile_latency": (_ratio(samples["compile"], samples["candidate"], resolution)
                                           if "compile" in samples else None),
            "noise": noise, "block_medians_us": [m1, m2],
            "overhead_us": {"runner_round_trip": runner_overhead, "judge_sync": Stats.from_samples(raw["empty"]).median},
            "floor_us": floor, "roofline_floor_us": self.floor_us(ceil),
            "fraction_of_floor": (floor / cand_med) if cand_med > 0 else math.inf,
            "resolution_us": resolution, "below_resolution": floor <= resolution,
            "impossible": impossible_time(cand_med, floor, resolution),
            "checked_timed_runs": checked, "calls_per_sample": K,
            "sample_sized_by_us": sized_by_us, "sets_held": acc.sets,
            "eager_off": sum(n for where, n in self.eager_off.items() if where.startswith("timed run")),
            "quiet": verdict.quiet, "noisy_reasons": verdict.reasons, "load_notes": notes.reasons,
            "threads_note": threads_note, "attempts": attempts,
            "runner_cpu_while_frozen_ns": ran_while_frozen,
            "protocol": {**timer.describe(), "warmup": warmup, "repeats": repeats, "blocks": 2,
                         "samples": check.n, "min_samples": least, "max_samples": most,
                         "calls_per_sample": K, "threads": threads, "clock": self.clock,
                         "fresh_inputs_every_run": True,
                         "outputs_checked_every_timed_run": True,
                         "speedup": "median of the paired ratios, eager's sample over the candidate's taken "
                                    "right after it; samples added until its 95% interval is within "
                                    f"{100 * max_width:.0f}% of it (or {most} samples)",
                         "baselines": "timed in the judge's process while the candidate's process is stopped",
                         "candidate": "judge's clock around the request to the runner, which replies once the "
                                      "device is idle; the runner's empty round trip (measured before the "
                                      "candidate was loaded) subtracted",
                         "compile_device": "CUDA events around the compiled baseline's calls, the device "
                                           "held busy while the host enqueues them: its kernels' time, "
                                           "not its guards' and wrappers'"},
        }

