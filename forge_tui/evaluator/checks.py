"""What runs inside the evaluator's worker process: correctness checks and timing of one candidate.

Correctness (all must hold on every input set: the card's captured samples and at least three
fresh random sets drawn from varied distributions):

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

Timing: candidate, eager reference and (where it compiles) torch.compile of the reference are
timed interleaved with the shared Timer. Between timed runs the input contents rotate among the
input sets and the outputs are re-poisoned, and every timed run's outputs are checked, so a
candidate that caches results or does the work only once is caught. Two timing blocks give the
measurement noise. A time under the roofline floor is flagged as impossible, unless the floor
is within the timer's resolution (decode-sized cards).
"""

from __future__ import annotations

import math
import random
import time
import traceback
from typing import Callable

from ..cards import Card
from ..compare import compare, tolerance
from ..inputs import random_inputs, sample_inputs
from ..program import bind_program, compile_source, run_program
from ..tensorstore import TensorStore, span
from ..timing import Stats, Timer, paired_ratio
from .abi import Library, card_scalars


class CandidateFailure(Exception):
    """The candidate broke a rule; ``kind`` names which."""

    def __init__(self, kind: str, message: str, detail: dict | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail or {}


class FatalDeviceError(Exception):
    """The device is in an unusable state (sticky CUDA error); the worker must restart."""


POISON_FLOAT = (float("nan"), -1.2345e4)
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
WORKSPACE_ALIGN = 256


def _alloc_workspace(nbytes: int, device: str):
    """A uint8 tensor of nbytes (at least 1) starting on a WORKSPACE_ALIGN-byte boundary."""
    import torch

    raw = torch.empty(max(nbytes, 1) + WORKSPACE_ALIGN, dtype=torch.uint8, device=device)
    off = (-raw.data_ptr()) % WORKSPACE_ALIGN
    return raw[off: off + max(nbytes, 1)]


def workspace_for(lib: Library, ins: list, outs: list, scalars: list, device: str):
    """The scratch buffer a candidate asks for on these arguments, or None when it uses plain
    forge_launch. A refusal or an oversized request is the candidate's failure."""
    if not lib.needs_workspace:
        return None
    try:
        n = lib.workspace_bytes(ins, outs, scalars)
    except ValueError as exc:
        raise CandidateFailure("workspace", str(exc)) from None
    return _alloc_workspace(n, device)


def _alloc_outputs(card: Card, device: str) -> list:
    import torch

    outs = []
    for s in card.outputs:
        dtype = getattr(torch, s.dtype)
        try:
            outs.append(torch.empty_strided(s.shape, s.stride, dtype=dtype, device=device))
        except RuntimeError:
            outs.append(torch.empty(s.shape, dtype=dtype, device=device))
    return outs


def _bits(t):
    """A view of t's bytes (bitwise comparison that treats NaN payloads exactly)."""
    import torch

    c = t.contiguous().reshape(-1)
    return c.view(torch.uint8) if c.numel() else c


def _clone_layout(t):
    """A copy with exactly t's shape and strides (clone() would compact a non-dense layout)."""
    flat = span(t).clone()
    return flat.as_strided(t.shape, t.stride(), 0)


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + a.untyped_storage().nbytes()
    b1 = b0 + b.untyped_storage().nbytes()
    return a0 < b1 and b0 < a1


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


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:  # sticky errors: illegal address, misaligned access, trap
            raise FatalDeviceError(str(exc).strip().splitlines()[0]) from None


class Evaluation:
    """One candidate on one card, inside the worker."""

    def __init__(self, card: Card, library: Library, store: TensorStore, device: str, options: dict,
                 phase: Callable[[str], None], compiled_cache: dict) -> None:
        self.card = card
        self.lib = library
        self.store = store
        self.device = device
        self.opt = options
        self.phase = phase
        self.compiled_cache = compiled_cache
        self.scalars = card_scalars(card.program)
        self.seed = options.get("seed") or random.SystemRandom().randrange(1, 2**31)
        self.stream_handle = None
        if device == "cuda":
            import torch

            # The candidate launches on the stream the evaluator times on; work it sends anywhere
            # else is still counted (device-wide synchronisation before every end event).
            self.stream_handle = torch.cuda.current_stream().cuda_stream

    # ---- input sets ---------------------------------------------------------------------------
    def input_sets(self) -> list[tuple[str, list]]:
        sets = []
        for i in range(len(self.card.samples)):
            try:
                sets.append((f"captured-{i}", sample_inputs(self.card, self.store, i, self.device)))
            except FileNotFoundError:
                continue  # the cache was cleared: random sets still run
        for k in range(int(self.opt.get("random_sets", 3))):
            sets.append((f"random-{k}", random_inputs(self.card, self.device, seed=self.seed + k, draw=k)))
        return sets

    def reference(self, ins: list) -> list:
        """Expected outputs, computed on clones, in buffers of their own."""
        outs = run_program(self.card.program, [t.clone() for t in ins], self.device)
        return [o.clone() for o in outs]

    # ---- one checked call ---------------------------------------------------------------------
    def call(self, ins: list, outs: list, poison: int) -> None:
        """One call on outputs already holding poison ``poison``; its workspace gets the same."""
        ws = workspace_for(self.lib, ins, outs, self.scalars, self.device)
        fn = self.lib.bind(ins, outs, self.scalars, self.stream_handle, ws)
        if ws is not None:
            ws.fill_(WORKSPACE_POISON[poison])
        rc = fn()
        _sync(self.device)
        if rc != 0:
            raise CandidateFailure("returned_error", f"forge_launch returned {rc}")

    def check_outputs(self, where: str, ins: list, outs: list, expected: list) -> None:
        import torch

        for k, (o, e) in enumerate(zip(outs, expected)):
            mismatch = compare(o, e, k, scale=_rms(e))
            if mismatch is not None:
                unwritten = self._unwritten(o, e)
                if unwritten:
                    raise CandidateFailure("unwritten", f"{where}: output {k}: {unwritten} of {o.numel()} elements "
                                           "were never written (still hold the poison the evaluator filled in)")
                raise CandidateFailure("mismatch", f"{where}: {mismatch}",
                                       {"max_abs_err": mismatch.max_abs_err, "bad_fraction": mismatch.bad_fraction})
            if _is_constant(o) and not _is_constant(e):
                raise CandidateFailure("constant", f"{where}: output {k} is constant where the reference is not")
            for j, t in enumerate(ins):
                if t.shape == o.shape and t.dtype == o.dtype and torch.equal(t, o) and not torch.equal(t, e):
                    raise CandidateFailure("copy_of_input", f"{where}: output {k} is a copy of input {j}")

    @staticmethod
    def _unwritten(o, e) -> int:
        """Elements still holding one of the poisons where the reference holds something else."""
        import torch

        if o.dtype == torch.bool:
            return 0
        if o.is_floating_point():
            hit = (torch.isnan(o) & ~torch.isnan(e)) | ((o == POISON_FLOAT[1]) & (e != POISON_FLOAT[1]))
        else:
            hit = torch.zeros_like(o, dtype=torch.bool)
            for p in POISON_INT:
                hit |= (o == p) & (e != p)
        return int(hit.sum())

    def check_set(self, name: str, ins: list) -> dict:
        import torch

        expected = self.reference(ins)
        snapshot = [_bits(t).clone() for t in ins]
        outs = _alloc_outputs(self.card, self.device)
        for o in outs:
            for t in ins:
                if _overlaps(o, t):
                    raise CandidateFailure("alias", f"{name}: an output overlaps an input")  # evaluator bug guard
        for o in outs:
            _poison(o, 0)
        self.call(ins, outs, 0)
        for j, (t, snap) in enumerate(zip(ins, snapshot)):
            if not torch.equal(_bits(t), snap):
                raise CandidateFailure("mutated_input", f"{name}: input {j} was modified by the candidate")
        self.check_outputs(name, ins, outs, expected)
        first = [o.clone() for o in outs]
        for o in outs:
            _poison(o, 1)
        self.call(ins, outs, 1)
        determinism = "bitwise"
        for k, (a, b) in enumerate(zip(outs, first)):
            if torch.equal(_bits(a), _bits(b)):
                continue
            r, at = tolerance(str(a.dtype).removeprefix("torch."))
            m = compare(a, b, k, rtol=r, atol=at, scale=_rms(b))
            if m is not None:
                raise CandidateFailure("nondeterministic", f"{name}: a second run on the same inputs disagrees "
                                       f"with the first ({m})")
            determinism = "within rounding"
        self.check_outputs(name + " (second run)", ins, outs, expected)
        degenerate = all(self._constant_passes(e) for e in expected)
        return {"name": name, "ok": True, "determinism": determinism, "degenerate": degenerate,
                "expected": expected}

    @staticmethod
    def _constant_passes(e) -> bool:
        import torch

        if not e.is_floating_point() or e.numel() <= 1:
            return False
        scale = _rms(e)
        for value in (0.0, float(torch.nan_to_num(e.double(), nan=0.0).mean())):
            if compare(torch.full_like(e, value), e, scale=scale) is None:
                return True
        return False

    # ---- timing -------------------------------------------------------------------------------
    def compiled_baseline(self):
        """torch.compile of the reference, cached per card in this worker; None if it fails."""
        mode = self.opt.get("compile_baseline", "auto")
        if mode is False or (mode == "auto" and self.device != "cuda"):
            return None, "not requested on this backend"
        key = self.card.id
        if key not in self.compiled_cache:
            import torch

            fn = compile_source(self.card.program, len(self.card.inputs))
            try:
                self.phase("compile-baseline")
                compiled = torch.compile(fn, dynamic=False)
                self.compiled_cache[key] = (compiled, None)
            except Exception as exc:  # noqa: BLE001
                self.compiled_cache[key] = (None, f"{type(exc).__name__}: {exc}")
        return self.compiled_cache[key]

    def time(self, sets: list[tuple[str, list, list]], ceil: dict) -> dict:
        from ..profiler import roofline

        timer = Timer(self.device, warmup=int(self.opt.get("warmup", 3)), repeats=int(self.opt.get("repeats", 20)),
                      cold_l2=bool(self.opt.get("cold_l2", True)), flush_mib=int(self.opt.get("flush_mib", 256)))
        rot = sets[: max(1, min(3, len(sets)))]
        tin = [_clone_layout(t) for t in rot[0][1]]  # the card's strides, exactly
        outs = _alloc_outputs(self.card, self.device)
        ws = workspace_for(self.lib, tin, outs, self.scalars, self.device)
        cand = self.lib.bind(tin, outs, self.scalars, self.stream_handle, ws)

        def candidate():
            rc = cand()
            if rc != 0:
                raise CandidateFailure("returned_error", f"forge_launch returned {rc} in a timed run")
        fns = {"candidate": candidate, "eager": bind_program(self.card.program, tin, self.device)}
        compiled, compile_note = self.compiled_baseline()
        if compiled is not None:
            try:
                self.phase("compile-baseline")
                compiled(*tin, device=self.device)  # compile now, outside the timed warm-up
                _sync(self.device)
                fns["compile"] = lambda: compiled(*tin, device=self.device)
            except FatalDeviceError:
                raise
            except Exception as exc:  # noqa: BLE001
                compile_note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self.compiled_cache[self.card.id] = (None, compile_note)
        checked = {"runs": 0}
        current = {"set": 0}

        def before(name: str, i: int) -> None:
            if name != "candidate":
                return
            k = i % len(rot)
            current["set"] = k
            for dst, src in zip(tin, rot[k][1]):
                span(dst).copy_(span(src))
            for o in outs:
                _poison(o, i % 2)
            if ws is not None:
                ws.fill_(WORKSPACE_POISON[i % 2])
            _sync(self.device)

        def after(name: str, i: int) -> None:
            if name != "candidate":
                return
            _sync(self.device)
            k = current["set"]
            self.check_outputs(f"timed run {i} ({rot[k][0]})", tin, outs, rot[k][2])
            checked["runs"] += 1

        self.phase("timing")
        blocks, resolution = [], 0.0
        for _ in range(2):
            stats, raw, overhead = timer.time(fns, before_each=before, after_each=after)
            blocks.append((stats, raw, overhead))
            resolution = max(resolution, timer.overhead_iqr_us)
        raw = {n: blocks[0][1][n] + blocks[1][1][n] for n in fns}
        stats = {n: Stats.from_samples(v) for n, v in raw.items()}
        m1, m2 = blocks[0][0]["candidate"].median, blocks[1][0]["candidate"].median
        noise = abs(m1 - m2) / min(m1, m2) if min(m1, m2) > 0 else 0.0
        floor = roofline.floor_us(self.card.bytes, self.card.flops, self.card.dtype, ceil)
        cand_med = stats["candidate"].median
        out = {
            "candidate": stats["candidate"].to_json(), "eager": stats["eager"].to_json(),
            "compile": stats["compile"].to_json() if "compile" in stats else None,
            "compile_note": compile_note,
            "speedup_vs_eager": paired_ratio(raw["eager"], raw["candidate"]).to_json(),
            "speedup_vs_compile": paired_ratio(raw["compile"], raw["candidate"]).to_json() if "compile" in raw else None,
            "noise": noise, "block_medians_us": [m1, m2],
            "overhead_us": [b[2] for b in blocks],
            "floor_us": floor, "fraction_of_floor": (floor / cand_med) if cand_med > 0 else math.inf,
            "resolution_us": resolution, "below_resolution": floor <= resolution,
            "impossible": impossible_time(cand_med, floor, resolution),
            "checked_timed_runs": checked["runs"],
            "protocol": {**timer.describe(), "blocks": 2, "rotated_input_sets": [s[0] for s in rot],
                         "outputs_checked_every_timed_run": True},
        }
        return out

    # ---- all ----------------------------------------------------------------------------------
    def run(self, ceil: dict, do_timing: bool = True) -> dict:
        self.phase("correctness")
        sets = []
        results = []
        for name, ins in self.input_sets():
            res = self.check_set(name, ins)
            sets.append((name, ins, res.pop("expected")))
            results.append(res)
        correctness = {"sets": results, "seed": self.seed,
                       "degenerate_card": bool(results) and all(r["degenerate"] for r in results),
                       "scalars": [[s.name, s.value] for s in self.scalars]}
        timing = self.time(sets, ceil) if do_timing else None
        return {"correctness": correctness, "timing": timing}


def evaluate_in_worker(request: dict, phase: Callable[[str], None], state: dict) -> dict:
    """Entry point used by the worker loop. Returns the correctness/timing part of a result."""
    from ..profiler import roofline

    t0 = time.perf_counter()
    card = Card.model_validate(request["card"])
    device = request["device"]
    libs = state.setdefault("libs", {})
    path = request["library"]
    try:
        lib = libs.get(path) or Library(path)
    except (OSError, LookupError) as exc:
        return {"status": "rejected", "failure": "load", "reason": f"the library could not be loaded: {exc}"}
    libs[path] = lib
    if "ceilings" not in state:
        state["ceilings"] = roofline.ceilings(device)
    ev = Evaluation(card, lib, TensorStore(request["store"]), device, request.get("options", {}), phase,
                    state.setdefault("compiled", {}))
    try:
        body = ev.run(state["ceilings"], do_timing=request.get("options", {}).get("timing", True))
    except CandidateFailure as fail:
        return {"status": "rejected", "failure": fail.kind, "reason": str(fail), "detail": fail.detail,
                "seed": ev.seed, "seconds": time.perf_counter() - t0}
    except FatalDeviceError:
        raise
    except Exception as exc:  # noqa: BLE001 - an exception from the harness itself, reported as such
        return {"status": "error", "failure": "harness", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6), "seed": ev.seed}
    status = "passed"
    reason = ""
    timing = body.get("timing")
    if timing and timing["impossible"]:
        status = "rejected"
        reason = (f"measured {timing['candidate']['median']:.2f} µs, under 90% of the roofline floor "
                  f"{timing['floor_us']:.2f} µs: impossible, so the measurement or the candidate is wrong")
        body["failure"] = "impossible_time"
    return {"status": status, "reason": reason, **body, "seconds": time.perf_counter() - t0}
