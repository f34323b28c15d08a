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
never settles or moves during the measurement (``timing_protocol.TimedEvaluation.time``).
"""

from __future__ import annotations

import math
import os
import random
import time
from typing import TYPE_CHECKING, Callable

from ..cards import Card
from ..compare import compare, tolerance
from ..inputs import adversarial_inputs, fresh_inputs_into, near_duplicates, random_inputs, sample_inputs
from ..kernel_abi import card_scalars
from ..program import run_program, run_program_float64
from ..tensorstore import TensorStore, span
from .accused import MAX_SETS, Accused
from .harness import POISON_FLOAT, POISON_INT, WORKSPACE_POISON, CandidateFailure, as_bytes, fill_poison, sync_device
from .request import JudgeRequest

if TYPE_CHECKING:
    import torch


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



class CheckedEvaluation:
    """One candidate on one card, judged here, run in its own process: its runner, input sets and
    correctness checks (``timing_protocol.TimedEvaluation`` adds the timing, ``judge.Evaluation`` the
    whole run)."""

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
        counts for eager's thread and for the runner's process: ``TimedEvaluation.time``)."""

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
        sync_device(self.device)

    def _write_inputs(self, ins: list) -> None:
        for dst, src in zip(self.acc.inputs, ins):
            span(dst).copy_(span(src))

    def _poison_all(self, which: int) -> None:
        for o in self.acc.outputs:
            fill_poison(o, which)
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

        made: list = []

        def own() -> list | None:
            """The evaluator's own inputs, made once where ``pristine`` makes them."""
            if not callable(pristine):
                return pristine
            if not made:
                made.append(pristine())
            return made[0]

        for k, (o, e) in enumerate(zip(outs, expected)):
            mismatch = compare(o, e, k, scale=_rms(e), nonfinite=nonfinite)
            if mismatch is not None:
                unwritten = self._unwritten(o, e, poison, nonfinite)
                if unwritten:
                    raise CandidateFailure("unwritten", f"{where}: output {k}: {unwritten} of {o.numel()} elements "
                                           "were never written (still hold the poison the evaluator filled in)")
                mine = own()
                off = 0 if mine is None else self.eager_is_off(k, mine, o, e, expected, nonfinite)
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
                    mine = own()
                    if mine is None or not self._is_truth(k, mine, o, expected):
                        raise CandidateFailure("copy_of_input", f"{where}: output {k} is a copy of input {j}")

    def _is_truth(self, k: int, ins: list, o, expected: list) -> bool:
        """Is output ``o`` bit for bit the program's float64 truth, rounded to its dtype (either
        rounding ``eager_is_off`` tries)? An output equal to its input is a copy only where the
        truth is not the input: Gemma's soft-cap ``tanh(x / 30) * 30`` of bf16 inputs under 3 in
        magnitude is exactly ``x`` once computed in fp32 and rounded once, where eager's three
        bf16 roundings land an ulp off at some elements."""
        import torch

        for rounding in ("ops", "casts"):
            truth = self._truth(ins, expected, rounding)
            if truth is not None and k < len(truth) and tuple(truth[k].shape) == tuple(o.shape) \
                    and torch.equal(truth[k].to(o.device, o.dtype), o):
                return True
        return False

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
        snapshot = [as_bytes(t).clone() for t in self.acc.inputs]
        self.call(0, name)
        for j, (t, snap) in enumerate(zip(self.acc.inputs, snapshot)):
            if not torch.equal(as_bytes(t), snap):
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
            if torch.equal(as_bytes(a), as_bytes(b)):
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
