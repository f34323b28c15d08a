"""The judge: correctness checks and timing of one candidate, in the evaluator's worker process.

The candidate never runs here. It runs in a runner process of its own (``accused.py``,
``runner.c``), fresh for every candidate and confined by the kernel, which shares with this
process only the candidate's inputs, outputs and workspace. Expected outputs, the reference, the
comparison and the clocks live here, out of its reach; so do the eager and torch.compile
baselines, timed only while the runner is frozen (SIGSTOP), in a process where no candidate code
has ever run.

Correctness (all must hold on every input set: the card's captured samples, at least three
fresh random sets drawn from varied distributions, and the adversarial sets of the card's kind:
magnitudes near the exponential's overflow, zero rows, tiny values, a large offset, NaN and ±inf):

* outputs are allocated here and pre-filled with poison before every call; an element the
  candidate does not write is caught (two different poisons in two runs);
* a candidate's scratch workspace (forge_launch_ws) is allocated here and re-poisoned before every
  call, checked or timed, so nothing can be carried in it from one call to the next;
* inputs are bit-identical after the call; no output overlaps an input;
* the reference ran on clones and its outputs live in their own buffers, kept alive;
* outputs match within the dtype's tolerance, NaN/Inf exactly where the reference has them;
* a second run agrees with the first bit for bit or within rounding;
* an output that is constant where the reference is not fails; an output that is a copy of an
  input where the reference is not fails; cards on which a constant would pass are flagged.

State across calls: after the input sets, a sequence of near-duplicate inputs (each one element
apart from the one before, then the first again), every output checked against its own input's
reference; a kernel that returns an earlier call's output keeps state across calls and is
rejected. The runner hands every call fresh copies of its descriptors, and may run no threads
beyond its own and an OpenMP team of the configured size (counted after every call).

Timing: every timed run gets inputs never seen before (fresh random contents written into the
shared buffers), so no state a candidate keeps between calls (statics, device globals, files)
can stand in for the work. Per run: fresh inputs; the runner frozen; eager (whose outputs are
the expected ones), torch.compile and an empty probe timed; the runner thawed; the candidate
called with poisoned outputs and timed by this process's clock from the request to the reply
(which comes once the device is idle); the runner frozen again; its outputs checked, and checked
again later to catch writes that land after the reply. A time under the roofline floor (as far
as eager's own time allows) is impossible (unless the floor is within the timer's resolution).
The speedup is the median of the paired ratios; load delays it (more samples until its interval
is tight; one thread each on a busy CPU) and does not deny it: ``noisy`` is for a ratio that
never settles or moves during the measurement (``Evaluation.time``).
"""

from __future__ import annotations

import functools
import math
import os
import random
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import roofline
from ..cards import Card
from ..compare import compare, tolerance
from ..inputs import DISTRIBUTIONS, adversarial_inputs, fresh_inputs_into, near_duplicates, random_inputs, sample_inputs
from ..kernel_abi import card_scalars
from ..program import bind_program, compile_source, first_compiled_call, run_program, run_program_float64
from ..quiet import Calibration, Verdict, oversubscribed_reason, oversubscription, profile_reason, spread_reason
from ..tensorstore import TensorStore, span
from ..timing import SLEEP_CYCLES, Stats, Timer, ratio_check
from .accused import MAX_SETS, Accused, CandidateProcessError
from .request import JudgeRequest

if TYPE_CHECKING:
    import torch


class CandidateFailure(Exception):
    """The candidate broke a rule; ``kind`` names which."""

    def __init__(self, kind: str, message: str, detail: dict | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail or {}


class FatalDeviceError(Exception):
    """The device is in an unusable state (sticky CUDA error); the worker must restart."""


POISON_FLOAT = (-1.2345e4, float("nan"))
"""The first call of each set sees a finite sentinel (an element left unwritten is then certain,
not confused with a NaN the candidate computed), the second NaN."""
POISON_INT = (-0x5A5A5A5A, 0x2B2B2B2B)


def _poison(t, which: int) -> None:
    import torch

    if t.dtype == torch.bool:
        t.fill_(which == 0)
    elif t.is_floating_point():
        t.fill_(POISON_FLOAT[which])
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(max(min(POISON_INT[which], info.max), info.min))


WORKSPACE_POISON = (0xFF, 0x7F)  # bytes: NaN / a huge finite float, -1 / a huge integer


def _bits(t):
    """A view of t's bytes (bitwise comparison that treats NaN payloads exactly)."""
    import torch

    c = t.contiguous().reshape(-1)
    return c.view(torch.uint8) if c.numel() else c


def _rms(t) -> float:
    import torch

    if not t.is_floating_point() or t.numel() == 0:
        return 1.0
    v = t.double()
    v = v[torch.isfinite(v)]
    return float(v.pow(2).mean().sqrt()) if v.numel() else 1.0


def _is_constant(t) -> bool:
    import torch

    if t.numel() <= 1:
        return False
    flat = t.reshape(-1)
    if t.is_floating_point():
        return bool(torch.equal(torch.nan_to_num(flat, nan=0.0), torch.nan_to_num(flat[:1].expand_as(flat), nan=0.0)))
    return bool((flat == flat[0]).all())


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


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:  # sticky errors: illegal address, misaligned access, trap
            raise FatalDeviceError(str(exc).strip().splitlines()[0]) from None


class Evaluation:
    """One candidate on one card, judged here, run in its own process."""

    def __init__(self, card: Card, request: JudgeRequest, store: TensorStore, device: str,
                 phase: Callable[[str], None], state: dict) -> None:
        self.card = card
        self.library = request.library
        self.runner = request.runner
        self.store = store
        self.device = device
        self.opt = request.options
        self.tcfg = request.timing
        self.current_phase = "load"
        self.phase_seconds: dict[str, float] = {}
        self._phase_t0 = time.perf_counter()

        def _phase(name: str) -> None:
            now = time.perf_counter()
            key = self.current_phase
            self.phase_seconds[key] = self.phase_seconds.get(key, 0.0) + now - self._phase_t0
            self._phase_t0 = now
            self.current_phase = name
            phase(name)

        self.phase = _phase
        self.state = state
        self.scalars = card_scalars(card.program)
        self.seed = self.opt.seed or random.SystemRandom().randrange(1, 2**31)
        self.threads = self.tcfg.threads or len(os.sched_getaffinity(0))
        self._acc: Accused | None = None
        self._spot: "torch.Generator | None" = None
        self._truth_cache: tuple[object, dict[str, list | None]] | None = None
        """(the expected outputs of the set being checked, its float64 truth or None)."""
        self.eager_off: dict[str, int] = {}
        """Per check: the elements accepted where the candidate missed eager and was closer than
        eager to the float64 truth (``eager_is_off``)."""
        self.sets_passed: list[str] = []
        """The input sets found correct so far (a failure names the ones before it)."""
        self._free_bytes: int | None = None
        self._last_beat = time.monotonic()
        self.clock = "wall"
        """What timing reads: "wall" (the host clock), or "cpu" on a busy CPU (the CPU time the kernel
        counts for eager's thread and for the runner's process: ``Evaluation.time``)."""

    def sample_target_us(self) -> float:
        """How long one timed sample of the candidate should last: ``batch_us``, at least 2 ms on
        the GPU (a round trip to another process there costs a context switch too, ~100 µs, and
        a loaded host's wake-ups more: the sample must be long beside them)."""
        target = self.tcfg.batch_us
        if self.device == "cuda":
            target = max(target, 2000.0)
        return target

    def calls_for(self, est_us: float | None) -> int:
        """Calls, each on its own fresh inputs, that make a sample of calls lasting ``est_us``
        each last ``sample_target_us``, within MAX_SETS and the buffers' memory budget (256 MiB
        on the cpu; on the GPU 4 GiB or an eighth of its free memory, whichever is less: several
        evaluations run at once beside the user's own work)."""
        target = self.sample_target_us()
        est = max(est_us or target, 0.5)
        k = max(1, min(MAX_SETS, math.ceil(target / est)))
        per_set = max(1, sum(s.numel for s in self.card.inputs + self.card.outputs) * 8)
        budget = min(4 << 30, self._free_device_bytes() // 8) if self.device == "cuda" else (256 << 20)
        return max(1, min(k, budget // per_set))

    def _free_device_bytes(self) -> int:
        """The GPU's free memory (bytes), asked once an evaluation."""
        if self._free_bytes is None:
            import torch

            self._free_bytes = int(torch.cuda.mem_get_info()[0])
        return self._free_bytes

    def calls_per_sample(self, floor_us: float | None = None) -> int:
        """The input sets the runner holds: as many as a sample needs if the candidate ran at the
        card's floor (``floor_us``; without one, at eager's profiled time). Timing starts with the
        calls eager's time asks for and grows to what the candidate's own warm-up time asks for
        (``time``): a kernel 10x faster than eager would otherwise be timed in samples a tenth as
        long as intended, and a loaded host's jitter be most of each."""
        if not self.opt.timing:
            return 1
        return self.calls_for(floor_us if floor_us else self.card.time_us)

    @property
    def acc(self) -> Accused:
        """The candidate's runner (exists from the start of ``run``)."""
        if self._acc is None:
            raise RuntimeError("the runner is started by run()")
        return self._acc

    def runner_pid(self) -> int | None:
        return self._acc.proc.pid if self._acc is not None and self._acc.proc is not None else None

    # ---- input sets ---------------------------------------------------------------------------
    def input_sets(self) -> list[tuple[str, list]]:
        sets = []
        for i in range(len(self.card.samples)):
            try:
                sets.append((f"captured-{i}", sample_inputs(self.card, self.store, i, self.device)))
            except FileNotFoundError:
                continue  # the cache was cleared: random sets still run
        for k in range(self.opt.random_sets):
            sets.append((f"random-{k}", random_inputs(self.card, self.device, seed=self.seed + k, draw=k)))
        if self.opt.adversarial:
            for name, ins in adversarial_inputs(self.card, self.device, self.seed + 7919):
                sets.append((f"adversarial-{name}", ins))
        return sets

    def reference(self, ins: list) -> list:
        """Expected outputs, computed on clones, in buffers of their own."""
        outs = run_program(self.card.program, [t.clone() for t in ins], self.device)
        return [o.clone() for o in outs]

    # ---- one checked call ---------------------------------------------------------------------
    def _sync(self) -> None:
        _sync(self.device)

    def _write_inputs(self, ins: list) -> None:
        for dst, src in zip(self.acc.inputs, ins):
            span(dst).copy_(span(src))

    def _poison_all(self, which: int) -> None:
        for o in self.acc.outputs:
            _poison(o, which)
        if self.acc.workspace is not None:
            self.acc.workspace.fill_(WORKSPACE_POISON[which])

    def call(self, poison: int, where: str = "") -> int:
        """One call on outputs (and workspace) freshly filled with poison ``poison``; the round
        trip in ns on this process's clock."""
        self._poison_all(poison)
        self._sync()
        rc, ns = self.acc.call()
        if rc != 0:
            raise CandidateFailure("returned_error", f"forge_launch returned {rc}" + (f" in {where}" if where else ""))
        self.check_threads(where)
        return ns

    CUDA_DRIVER_THREADS = 2
    """Threads the CUDA driver may start in the runner once a candidate launches (beside those it
    started at initialisation, before the candidate was loaded)."""

    def allowed_threads(self) -> int | None:
        """The threads the candidate's process may run: the runner's own (and the driver's) before
        the library was loaded, and an OpenMP team of ``threads``; None where the kernel does not
        count them."""
        base = self.acc.base_tasks
        if base is None:
            return None
        return base + max(self.threads - 1, 0) + (self.CUDA_DRIVER_THREADS if self.device == "cuda" else 0)

    def check_threads(self, where: str) -> None:
        """Refuses a candidate whose process runs threads of its own beyond its OpenMP team: a thread
        left running (a burner) could slow eager while eager is timed, and its work would not be
        the call's. The runner is frozen (every thread of it) while eager runs; this makes the rule
        one a user can read."""
        allowed, now = self.allowed_threads(), self.acc.task_count()
        if allowed is None or now is None or now <= allowed:
            return
        raise CandidateFailure("threads", (f"{where}: " if where else "") +
                               f"the candidate's process runs {now} threads where it may run {allowed} (the "
                               f"runner's own and an OpenMP team of {self.threads}): a candidate may not start "
                               "threads of its own (they could run while eager is timed)",
                               {"threads": now, "allowed": allowed})

    def check_outputs(self, where: str, ins: list, outs: list, expected: list, nonfinite: str = "exact",
                      poison: int | None = None, pristine: list | Callable[[], list] | None = None) -> None:
        """Each output against the expected one. With ``pristine`` (the evaluator's own copy of the
        inputs, which the candidate never touched, or what makes one: ``regenerated``) a miss may be
        arbitrated (``eager_is_off``); without it never (the input buffers themselves the candidate
        could have written)."""
        import torch

        made: list | None = None
        for k, (o, e) in enumerate(zip(outs, expected)):
            mismatch = compare(o, e, k, scale=_rms(e), nonfinite=nonfinite)
            if mismatch is not None:
                unwritten = self._unwritten(o, e, poison, nonfinite)
                if unwritten:
                    raise CandidateFailure("unwritten", f"{where}: output {k}: {unwritten} of {o.numel()} elements "
                                           "were never written (still hold the poison the evaluator filled in)")
                if callable(pristine) and made is None:
                    made = pristine()
                own = made if callable(pristine) else pristine
                off = 0 if own is None else self.eager_is_off(k, own, o, e, expected, nonfinite)
                if not off:
                    raise CandidateFailure("mismatch", f"{where}: {mismatch}",
                                           {"max_abs_err": mismatch.max_abs_err, "bad_fraction": mismatch.bad_fraction,
                                            "where": where, "output": k, "message": mismatch.reason,
                                            "first_mismatches": [b.to_json() for b in mismatch.first]})
                self.eager_off[where] = self.eager_off.get(where, 0) + off
            if _is_constant(o) and not _is_constant(e):
                raise CandidateFailure("constant", f"{where}: output {k} is constant where the reference is not")
            for j, t in enumerate(ins):
                if t.shape == o.shape and t.dtype == o.dtype and torch.equal(t, o) and not torch.equal(t, e):
                    raise CandidateFailure("copy_of_input", f"{where}: output {k} is a copy of input {j}")

    def _truth(self, ins: list, expected: list, rounding: str = "ops") -> list | None:
        """The card's program in float64 on the set's inputs (``run_program_float64`` with
        ``rounding``), computed once per set and rounding; None where it cannot run so, and for
        cards that mutate their inputs."""
        if self._truth_cache is None or self._truth_cache[0] is not expected:
            self._truth_cache = (expected, {})
        cache = self._truth_cache[1]
        if rounding not in cache:
            truth: list | None = None
            if "mutates" not in self.card.flags:
                try:
                    truth = run_program_float64(self.card.program, ins, self.device, rounding=rounding)
                except Exception:  # noqa: BLE001 - NoFloat64Result, or a program that runs otherwise in
                    truth = None   # float64 (a shape that depends on values): no arbiter
            cache[rounding] = truth
        return cache[rounding]

    def eager_is_off(self, k: int, ins: list, o, e, expected: list, nonfinite: str = "exact") -> int:
        """Where a candidate's output ``o`` misses eager's ``e``, is eager the one that is off? The
        number of elements where the candidate misses eager when, at every one of them, the
        candidate, eager and the truth are finite, and the candidate is within tolerance of the program's float64 truth (each op exact,
        rounded to its eager dtype: ``run_program_float64``) and closer to it than eager is;
        0 otherwise (any other miss, or no truth). Why: eager's fp16 group norm of a small-magnitude
        channels-last input is off the float64 truth by far more than the tolerance in tens of its
        millions of elements, where float32 formulas stay well within it, and without this every
        correct kernel for such a card is rejected (eager's own error there is spread: a candidate near the truth misses eager
        also where eager is just inside the tolerance, on the other side). A candidate gains nothing
        here unless it is closer to the exact result than eager, element by element.

        Two truths are tried, in turn: each op rounded to its eager dtype, then only the model's
        own casts rounded (``rounding="casts"``), the truth of a kernel that keeps a chain in fp32
        and rounds its outputs once (the ``math`` modes: the decoder's rotary chain misses eager
        where eager's rounding of two large products cancels)."""
        return self._eager_is_off(k, ins, o, e, expected, nonfinite, "ops") or \
            self._eager_is_off(k, ins, o, e, expected, nonfinite, "casts")

    def _eager_is_off(self, k: int, ins: list, o, e, expected: list, nonfinite: str, rounding: str) -> int:
        import torch

        if not o.is_floating_point() or o.dtype == torch.float64 or not e.numel():
            return 0
        truth = self._truth(ins, expected, rounding)
        if truth is None or k >= len(truth) or tuple(truth[k].shape) != tuple(e.shape):
            return 0
        r, at = tolerance(str(e.dtype).removeprefix("torch."))
        s = _rms(e)
        a, x, t = o.double(), e.double(), truth[k].double()
        finite = torch.isfinite(a) & torch.isfinite(x) & torch.isfinite(t)
        miss = finite & ((a - x).abs() > at * s + r * x.abs())
        n = int(miss.sum())
        if not n or compare(torch.where(miss, e, o), e, k, scale=s, nonfinite=nonfinite) is not None:
            return 0  # no finite miss, or misses of another kind remain
        err_a, err_x = (a - t).abs(), (x - t).abs()
        right = (err_a <= at * s + r * t.abs()) & (err_a < err_x)
        return n if bool(right[miss].all()) else 0

    SPOT_ELEMENTS = 1 << 16

    def spot_check(self, where: str, ins: list, outs: list, expected: list, poison: int,
                   pristine: Callable[[], list] | None = None) -> None:
        """The check of a timed call: every element scanned for the poison (a skipped element is
        found for sure), the values compared at SPOT_ELEMENTS positions drawn at random after the
        call (a candidate cannot know which; wrong values anywhere but a vanishing fraction are
        found). Any doubt falls back to the full check, which names what is wrong (and may
        arbitrate on the ``pristine`` inputs)."""
        import torch

        for k, (o, e) in enumerate(zip(outs, expected)):
            if o.numel() <= 4 * self.SPOT_ELEMENTS or self._unwritten(o, e, poison):
                self.check_outputs(where, ins, outs, expected, poison=poison, pristine=pristine)
                return
            flat_o, flat_e = o.reshape(-1), e.reshape(-1)
            idx = torch.randint(0, o.numel(), (self.SPOT_ELEMENTS,), device=o.device, generator=self._spot_gen())
            if compare(flat_o[idx], flat_e[idx], k, scale=_rms(flat_e[idx])) is not None:
                self.check_outputs(where, ins, outs, expected, poison=poison, pristine=pristine)
                return

    def regenerated(self, like: list, state: "torch.Tensor", draw: int) -> list:
        """The inputs of a timed call as the judge wrote them (``fresh_inputs_into`` again, from
        the generator's state before that call's draw, into fresh tensors of the same layouts):
        the evaluator's own copy, where the buffers the candidate ran on could have been written.
        A kernel that keeps a chain in fp32 (the ``math`` modes) misses eager at a few elements
        of millions where eager's roundings are off (the decoder's rotary, in a timed call after
        its input sets had passed by the arbiter); it is judged there as on its input sets."""
        import torch

        gen = torch.Generator(self.device)
        gen.set_state(state)
        copies = [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device) for t in like]
        fresh_inputs_into(self.card, copies, gen, draw)
        return copies

    def _spot_gen(self) -> "torch.Generator":
        """Positions for spot checks, drawn from a seed the candidate cannot know."""
        import torch

        if self._spot is None:
            self._spot = torch.Generator(self.device).manual_seed(random.SystemRandom().randrange(1, 2**62))
        return self._spot

    @staticmethod
    def _unwritten(o, e, which: int | None = None, nonfinite: str = "exact") -> int:
        """Elements still holding the poison (``which``, or either) where the reference holds
        something else. With ``nonfinite="position"`` (the special-value sets, where NaN and ±inf
        stand for each other), a NaN where the reference holds ±inf is a value the candidate may
        have written, not the NaN poison. Elements there left unwritten in both runs still hold the
        first run's finite poison, which that run's check catches; one skipped in the second run
        only is caught by the comparison of the two runs, unless the first wrote NaN there, a value
        the position rule accepts anyway."""
        import torch

        if o.dtype == torch.bool:
            return 0
        hit = None
        for k in ((0, 1) if which is None else (which,)):
            p = POISON_FLOAT[k] if o.is_floating_point() else POISON_INT[k]
            if o.is_floating_point() and math.isnan(p):
                h = torch.isnan(o) & (torch.isfinite(e) if nonfinite == "position" else ~torch.isnan(e))
            else:
                h = (o == p) & (e != p)
            hit = h if hit is None else hit | h
        return int(hit.sum()) if hit is not None else 0

    def check_set(self, name: str, ins: list) -> dict:
        import torch

        expected = self.reference(ins)
        self._write_inputs(ins)
        snapshot = [_bits(t).clone() for t in self.acc.inputs]
        self.call(0, name)
        for j, (t, snap) in enumerate(zip(self.acc.inputs, snapshot)):
            if not torch.equal(_bits(t), snap):
                raise CandidateFailure("mutated_input", f"{name}: input {j} was modified by the candidate")
        outs = self.acc.outputs
        nonfinite = "position" if name.endswith("-special") else "exact"
        self.check_outputs(name, self.acc.inputs, outs, expected, nonfinite, poison=0, pristine=ins)
        first = [o.clone() for o in outs]
        self.call(1, name + " (second run)")
        unwritten = [self._unwritten(o, e, 1, nonfinite) for o, e in zip(outs, expected)]
        if any(unwritten):
            k = next(i for i, n in enumerate(unwritten) if n)
            raise CandidateFailure("unwritten", f"{name} (second run): output {k}: {unwritten[k]} of {outs[k].numel()} "
                                   "elements were never written (still hold the poison the evaluator filled in)")
        determinism = "bitwise"
        for k, (a, b) in enumerate(zip(outs, first)):
            if torch.equal(_bits(a), _bits(b)):
                continue
            r, at = tolerance(str(a.dtype).removeprefix("torch."))
            m = compare(a, b, k, rtol=r, atol=at, scale=_rms(b))
            if m is not None:
                raise CandidateFailure("nondeterministic", f"{name}: a second run on the same inputs disagrees "
                                       f"with the first ({m})",
                                       {"where": name + " (second run)", "output": k, "message": m.reason,
                                        "first_mismatches": [b.to_json() for b in m.first],
                                        "compared_with": "the first run"})
            determinism = "within rounding"
        self.check_outputs(name + " (second run)", self.acc.inputs, outs, expected, nonfinite, poison=1, pristine=ins)
        degenerate = all(self._constant_passes(e) for e in expected)
        off = max(self.eager_off.get(name, 0), self.eager_off.get(name + " (second run)", 0))
        return {"name": name, "ok": True, "determinism": determinism, "degenerate": degenerate, "eager_off": off}

    def check_state(self) -> dict:
        """Does every output reflect its own input, whatever came before? Calls on near-duplicate
        inputs (``inputs.near_duplicates``: each one element apart from the one before, at a
        random place, then the first again), each checked against the reference for its own input.
        A kernel that keeps results from earlier calls (a memo keyed on a few sampled elements, a
        pointer, a call count) returns a stale one here, and is rejected as keeping state across
        calls: in a model, a KV cache grown by one token is such a near-duplicate. Fresh inputs
        for every timed call make such a memo useless for timing; this makes it visible."""
        steps = self.opt.near_duplicates
        if steps <= 0:
            return {"calls": 0}
        base = random_inputs(self.card, self.device, seed=self.seed + 4999, draw=0)
        seq = near_duplicates(self.card, base, steps, random.Random(self.seed + 31))
        returned: list[list] = []
        for j, (ins, what) in enumerate(seq):
            self.phase("correctness")
            where = f"near-duplicate input {j + 1} of {len(seq)} ({what})"
            expected = self.reference(ins)
            self._write_inputs(ins)
            self.call(j % 2, where)
            outs = self.acc.outputs
            try:
                self.check_outputs(where, self.acc.inputs, outs, expected, poison=j % 2, pristine=ins)
            except CandidateFailure as fail:
                earlier = self._stale_source(outs, returned) if fail.kind in ("mismatch", "constant") else None
                if earlier is None:
                    raise
                raise CandidateFailure("state", f"{where}: keeps state across calls: it returned the output of call "
                                       f"{earlier + 1} of the sequence, for an input that differs from this one",
                                       {**fail.detail, "where": where, "stale_call": earlier + 1}) from None
            returned.append([o.clone() for o in outs])
        return {"calls": len(seq)}

    @staticmethod
    def _stale_source(outs: list, returned: list[list]) -> int | None:
        """The latest earlier call whose outputs these are (within tolerance), or None."""
        for j in range(len(returned) - 1, -1, -1):
            if all(compare(o, p, k, scale=_rms(p)) is None for k, (o, p) in enumerate(zip(outs, returned[j]))):
                return j
        return None

    @staticmethod
    def _constant_passes(e) -> bool:
        import torch

        if not e.is_floating_point() or e.numel() <= 1:
            return False
        scale = _rms(e)
        v = e.double()
        finite = v[torch.isfinite(v)]
        for value in (0.0, float(finite.mean()) if finite.numel() else 0.0):
            if compare(torch.full_like(e, value), e, scale=scale) is None:
                return True
        return False

    # ---- timing -------------------------------------------------------------------------------
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
                            _poison(o, i % 2)
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
                    landed = [[_bits(o).clone() for o in outs] for outs in acc.batch_outputs[:K]]
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
                            if not torch.equal(_bits(o), before):
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
                            per_call = max(min(warm_ns) / 1000.0 - runner_overhead, 0.0) / K
                            K = max(K, min(acc.sets, self.calls_for(max(per_call, 0.5))))
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

    # ---- all ----------------------------------------------------------------------------------
    def run(self, ceil: dict, do_timing: bool = True) -> dict:
        import torch

        if self.device == "cpu":
            # the judge's own work (references, comparisons) on one thread where more threads are
            # ready to run than there are CPUs: a parallel op there waits for its slowest thread
            host = oversubscription()
            torch.set_num_threads(1 if host is not None and host > 1.0 else self.threads)
        self.phase("load")
        limit = self.opt.call_timeout_s
        self._acc = Accused(Path(self.runner), self.library, self.card.inputs, self.card.outputs, self.scalars,
                           self.device, threads=self.threads, call_limit_s=limit,
                           confinement=self.opt.confinement, landlock=self.opt.landlock,
                           sets=self.calls_per_sample(self.floor_us(ceil) if do_timing else None))
        with self.acc:
            timer = self._timer()
            self.acc.measure_overhead(max(11, self.tcfg.repeats), before=timer.prepare)
            self.acc.load()
            self.check_threads("once loaded")
            if self.acc.needs_workspace:
                self.acc.give_workspace(self.acc.size_workspace())
            self.phase("correctness")
            results = []
            for name, ins in self.input_sets():
                self.phase("correctness")  # one heartbeat per set: the client's limit is per set
                results.append(self.check_set(name, ins))
                self.sets_passed.append(name)
            state = self.check_state()
            correctness = {"sets": results, "seed": self.seed,
                           "degenerate_card": bool(results) and all(r["degenerate"] for r in results),
                           "scalars": [[s.name, s.value] for s in self.scalars], "state_calls": state["calls"]}
            timing = self.time(ceil) if do_timing else None
            confinement = dict(self.acc.confined)
        self.phase("done")
        return {"correctness": correctness, "timing": timing, "confinement": confinement,
                "runner_pid": self.runner_pid(), "phase_seconds": self.phase_seconds}


PROCESS_FAILURES = {"crash": ("crash", "crash"), "device_error": ("crash", "device_error"),
                    "timeout": ("timeout", "timeout"), "load": ("rejected", "load"),
                    "workspace": ("rejected", "workspace"), "confinement": ("error", "confinement"),
                    "harness": ("error", "harness")}


def evaluate_in_worker(request: dict, phase: Callable[[str], None], state: dict) -> dict:
    """Entry point used by the worker loop. Returns the correctness/timing part of a result."""
    t0 = time.perf_counter()
    req = JudgeRequest.model_validate({k: v for k, v in request.items() if k != "cmd"})
    card = Card.model_validate(req.card)
    device = req.device
    if "ceilings" not in state:
        state["ceilings"] = roofline.ceilings(device)
    ev = Evaluation(card, req, TensorStore(Path(req.store)), device, phase, state)
    try:
        body = ev.run(state["ceilings"], do_timing=req.options.timing)
    except CandidateFailure as fail:
        return {"status": "rejected", "failure": fail.kind, "reason": str(fail),
                "detail": {**fail.detail, "sets_passed": list(ev.sets_passed)}, "seed": ev.seed,
                "phase": ev.current_phase, "runner_pid": ev.runner_pid(), "seconds": time.perf_counter() - t0}
    except CandidateProcessError as exc:
        status, failure = PROCESS_FAILURES.get(exc.kind, ("error", exc.kind))
        return {"status": status, "failure": failure, "reason": str(exc), "seed": ev.seed,
                "detail": {"sets_passed": list(ev.sets_passed)}, "phase": ev.current_phase,
                "runner_pid": ev.runner_pid(), "seconds": time.perf_counter() - t0}
    except FatalDeviceError:
        raise
    except Exception as exc:  # noqa: BLE001 - an exception from the harness itself, reported as such
        return {"status": "error", "failure": "harness", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6), "seed": ev.seed}
    verdict, why, broke = timing_verdict(body.get("timing"))
    if broke:
        body["failure"] = broke
    return {"status": verdict, "reason": why, **body, "seconds": time.perf_counter() - t0}


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
