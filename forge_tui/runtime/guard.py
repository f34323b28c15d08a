"""A promoted card's guard in one model: the checks a call passes before its kernel serves it.

Every call goes through a guard: the kernel runs only when device, dtype, shape, strides and the
non-tensor arguments match the card; anything else runs the original PyTorch code. A kernel
error disables that kernel (the call and every later one run PyTorch) and records why. With
``shadow_every=N`` every Nth served call is also computed by the reference and compared; a
mismatch disables the kernel.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..compare import compare
from ..program import run_program
from ..ranges import OUTSIDE_RANGE, fits, input_ranges
from .kernel import CardKernel, KernelError, KernelUnavailable
from .manifest import Entry, Signature
from .specs import spec_mismatch
from .status import CardStatus, StatusBoard
from .trial import Trial, median_us

if TYPE_CHECKING:
    import torch


def verdict(guards: list["Guard"], with_us: float, without_us: float, calls: int, subject: str, with_what: str,
             **extra: Any) -> None:
    """A trial's outcome on the guards it decides for: recorded in their status, and each switched
    off unless the with-kernel side was faster."""
    kept = with_us < without_us
    for g in guards:
        g.status.trial = {"with_us": round(with_us, 2), "without_us": round(without_us, 2), "calls": calls,
                          "kept": kept, **extra}
        if not kept:
            g.board.disable(g.status, f"slower in place: {subject} took {with_us:.1f} µs with {with_what} and "
                                      f"{without_us:.1f} µs without (median of {calls} each)")
    if kept and guards:
        guards[0].board.write()


class Guard:
    """One promoted card in one model: matches calls, runs its kernel, keeps its status."""

    DISPATCH_SAMPLES = 5
    """Served calls timed before the guard decides whether dispatch eats the kernel's gain."""
    EAGER_SAMPLES = 3
    """Calls of a module card's original forward timed, where its dispatch looks too costly, before
    the guard decides: what eager's own call of the module costs the host (``time_eager``)."""
    EAGER_WHY = "eager's own call, timed for the dispatch check"
    DISPATCH_WARMUP = 3
    """Served calls before those, not counted: costs a kernel pays once in a model (a first call
    grows the allocator's pools for its outputs). Each leaf module that learns the card's site
    adds the calls it learns from (``LeafSites.LEARN_CALLS``, through the interceptor), so that
    a card served in many leaf modules is timed on their learned calls (``warmup``)."""

    def __init__(self, entry: Entry, folder: Path, device: str, board: StatusBoard, shadow_every: int,
                 consts: list["torch.Tensor"], only_faster: bool = True) -> None:
        self.entry = entry
        self.sig: Signature = entry.signature
        import torch

        self._specs = [(getattr(torch, sp.dtype), tuple(sp.shape), tuple(sp.stride)) for sp in self.sig.inputs]
        """The inputs' specs as the guard compares them per call (torch dtypes, tuples)."""
        self.ranged: dict[int, dict[int, tuple[int, int]]] = input_ranges(self.sig.ranges)
        """A range card's ranged dimensions per input (min, max): a call matches by shape class
        (``ranges.fits``: fixed dimensions equal, ranged ones inside their range), never by its
        exact shape; empty for an exact-shape card."""
        self.folder = folder
        self.device = device
        self.board = board
        self.status: CardStatus = board.card(entry.card, self.sig.kind, self.sig.target)
        self.shadow_every = shadow_every
        self.consts = consts
        self._kernel: CardKernel | None = None
        self._calls = 0
        self._lock = threading.Lock()
        self.only_faster = only_faster
        self._dispatch_ns: list[int] = []
        self._call_ns: list[int] = []
        """The same calls' whole host time, the launch included (beside ``_dispatch_ns``)."""
        self._eager_ns: list[int] = []
        self.eager_timable = False
        """Set where the caller can run eager's own call in the kernel's place (a module card's
        forward, op by op): the dispatch check then weighs what the call costs over eager's."""
        self.eager_pending = False
        """The dispatch looked too costly: the next calls time eager's own (``time_eager``)."""
        self._warm_calls = 0
        self.warmup = self.DISPATCH_WARMUP
        """Served calls not counted toward the dispatch cost (``DISPATCH_WARMUP``, and the
        learning calls of the leaf modules that serve the card)."""
        self.trial: Trial | None = None
        """Set by apply (trial_calls > 0 and only_faster): the in-place check of module cards."""
        self.own_op: Any = None
        """The custom op a compiled scope's graph calls for this guard alone (``IN_GRAPH``)."""
        self._lean: Callable[[list[Any]], Any] | None = None
        self._lean_tried = False
        """``serve`` once settled, for a kernel of one output (``_build_lean``), and whether it
        was built (or found impossible)."""
        ev = entry.evidence
        self.gain_us = (ev.eager_us - ev.time_us) if ev.eager_us is not None and ev.time_us is not None else None
        """What one call saves, by the evaluation's numbers (eager's time minus the kernel's)."""

    def mismatch(self, tensors: list["torch.Tensor"]) -> str | None:
        if len(tensors) != len(self.sig.inputs):
            return f"{len(tensors)} tensors where the card has {len(self.sig.inputs)}"
        if self.ranged:
            return self._class_mismatch(tensors)
        on_cuda = self.device == "cuda"
        for t, (dtype, shape, stride) in zip(tensors, self._specs):
            # the common case in one expression; the reason is worked out only for a miss
            if not (t.is_cuda if on_cuda else t.is_cpu) or t.dtype is not dtype or t.shape != shape or \
                    (t.stride() != stride and t.numel() > 1):
                break
        else:
            return None
        for k, (t, spec) in enumerate(zip(tensors, self._specs)):
            why = spec_mismatch(t, spec, self.device)
            if why:
                return f"input {k}: {why}"
        return None

    def _class_mismatch(self, tensors: list["torch.Tensor"]) -> str | None:
        """``mismatch`` of a range card: why the tensors are not of its shape class, the first
        reason that is not ``OUTSIDE_RANGE`` before that one (a call of another class says what
        differs; one of the class at sizes outside the range says so)."""
        outside = None
        for k, (t, spec) in enumerate(zip(tensors, self._specs)):
            if t.device.type != self.device:
                return f"input {k}: device {t.device.type}"
            why = fits(t, spec[0], spec[1], spec[2], self.ranged.get(k, {}))
            if why == OUTSIDE_RANGE:
                outside = outside or why
            elif why is not None:
                return f"input {k}: {why}"
        return outside

    def refuses(self, leading: list["torch.Tensor"]) -> bool:
        """Whether the card's specs refuse these tensors, its first inputs, whatever the others
        are: a call passing them is refused whatever else changes (the module's parameters, its
        attributes), so a refusal can be remembered by their specs alone (``graph.call_key``)."""
        if self.ranged:
            return len(leading) > len(self._specs) or any(
                t.device.type != self.device or fits(t, spec[0], spec[1], spec[2], self.ranged.get(k, {})) is not None
                for k, (t, spec) in enumerate(zip(leading, self._specs)))
        on_cuda = self.device == "cuda"
        for t, (dtype, shape, stride) in zip(leading, self._specs):
            if not (t.is_cuda if on_cuda else t.is_cpu) or t.dtype is not dtype or t.shape != shape or \
                    (t.stride() != stride and t.numel() > 1):
                return True
        return len(leading) > len(self._specs)

    def timing(self) -> bool:
        """Whether calls are still timed for the guard's own cost (its first calls only)."""
        return len(self._dispatch_ns) < self.DISPATCH_SAMPLES

    def kernel(self) -> CardKernel | None:
        if self._kernel is None and self.status.active:
            try:
                self._kernel = CardKernel(self.entry, self.folder, self.device)
            except KernelUnavailable as exc:
                self.board.disable(self.status, f"unavailable: {exc}")
        return self._kernel

    def _account_dispatch(self, ns: int, call_ns: int = 0) -> None:
        """The guard's own cost per call (its checks, descriptors and output allocation: all but
        the launch itself; ``call_ns``: the whole call's). Once measured, a kernel whose savings it
        eats is switched off; where eager's own call can be timed in its place
        (``eager_timable``), only if the call costs the host more than eager's by that much."""
        if not self.timing():
            return
        if self._warm_calls < self.warmup:
            self._warm_calls += 1
            return
        self._dispatch_ns.append(ns)
        self._call_ns.append(call_ns)
        if len(self._dispatch_ns) == self.DISPATCH_SAMPLES:
            us = median_us(self._dispatch_ns)
            self.status.dispatch_us = us
            if self.only_faster and self.gain_us is not None and us >= self.gain_us:
                if self.eager_timable:
                    self.eager_pending = True
                else:
                    self.board.disable(self.status, f"its dispatch costs {us:.1f} µs a call, more than the "
                                                    f"{max(self.gain_us, 0.0):.1f} µs it saves")

    def time_eager(self, call: Callable[[], Any]) -> Any:
        """Eager's own call in the kernel's place, timed (``eager_pending``; counted as a fallback
        for the dispatch check). After ``EAGER_SAMPLES`` of them: a kernel whose whole call costs
        the host more than eager's by at least what it saves on the device is switched off; one
        that costs less, or not that much more, stays."""
        t0 = time.perf_counter_ns()
        out = call()
        self._eager_ns.append(time.perf_counter_ns() - t0)
        self.board.fell_back(self.status, self.EAGER_WHY)
        if len(self._eager_ns) >= self.EAGER_SAMPLES:
            self.eager_pending = False
            eager, whole = median_us(self._eager_ns), median_us(self._call_ns)
            self.status.eager_call_us = eager
            gain = max(self.gain_us or 0.0, 0.0)
            if whole - eager >= gain:
                self.board.disable(self.status, f"its call costs the host {whole:.1f} µs, {whole - eager:.1f} more than "
                                                f"eager's own ({eager:.1f}), more than the {gain:.1f} µs it saves")
        return out

    def kernel_failed(self, exc: BaseException) -> None:
        """A served call's kernel failed: the card is switched off, the call falls back."""
        self.board.disable(self.status, f"kernel error: {exc}")
        self.board.fell_back(self.status, "kernel error")

    def settled(self) -> bool:
        """Whether a served call is no more than the checks and the launch (and, on its first
        calls, the timing of its dispatch): the kernel is loaded and no shadow check is due
        (``LeafSites.fast``)."""
        return self._kernel is not None and self.shadow_every <= 0 and not self.eager_pending and self.status.active

    def decide(self, with_us: float, without_us: float, calls: int) -> None:
        """The trial's verdict for this card."""
        verdict([self], with_us, without_us, calls, "a call", "the kernel")

    def reference(self, tensors: list["torch.Tensor"]) -> list["torch.Tensor"]:
        outs = run_program(self.sig.program, tensors, self.device)
        return [o.clone() if any(o.data_ptr() == t.data_ptr() for t in tensors) else o for o in outs]

    def serve(self, tensors: list["torch.Tensor"], checked_at: int | None = None,
              keep: int = -1) -> list["torch.Tensor"] | None:
        """The kernel's outputs for these inputs, or None: the caller runs PyTorch (the reason is
        counted). ``checked_at``: the caller has matched the tensors against the card already,
        starting at that perf_counter_ns (the guard's cost is counted from there; 0 when the
        caller did not time it). ``keep`` >= 0: the caller uses only that output, and the others
        are not allocated per call (``CardKernel._dead_output``); a shadow check then compares
        that one alone."""
        lean = self._lean
        if lean is not None:
            outs = lean(tensors)
            if outs is not NOT_SERVED:
                return outs  # type: ignore[no-any-return]
        status = self.status
        if not status.active:
            self.board.fell_back(status, "disabled")
            return None
        # the guard's own cost is timed on the first calls only (see _account_dispatch)
        timed = self.timing()
        t0 = (checked_at or time.perf_counter_ns()) if timed else 0
        if checked_at is None:
            why = self.mismatch(tensors)
            if why:
                self.board.fell_back(status, why)
                return None
        k = self._kernel if self._kernel is not None else self.kernel()
        if k is None:
            self.board.fell_back(status, "disabled")
            return None
        try:
            t1 = time.perf_counter_ns() if timed else 0
            outs = k(tensors, timed, keep)
        except KERNEL_ERRORS as exc:
            self.kernel_failed(exc)
            return None
        if timed:
            self._account_dispatch((t1 - t0) + k.last_host_ns, time.perf_counter_ns() - t0)
        if self.shadow_every > 0:
            with self._lock:
                self._calls += 1
                shadow = self._calls % self.shadow_every == 0
            if shadow:
                expected = self.reference(tensors)
                status.shadow_checks += 1
                for i, (o, e) in enumerate(zip(outs, expected)):
                    if keep >= 0 and i != keep:
                        continue
                    m = compare(o, e, i)
                    if m is not None:
                        self.board.disable(status, f"shadow check: {m}")
                        self.board.fell_back(status, "shadow check mismatch")
                        return expected
        self.board.served(status)
        if not self._lean_tried and not timed and self.settled():
            self._build_lean()
        return outs

    def _build_lean(self) -> None:
        """``serve`` for a settled guard (``settled``: the kernel loaded, its dispatch timed, no
        shadow check due) whose kernel has one output: the specs checked in one loop, the launch
        through ``CardKernel.bind`` (no ctypes conversion per call, the descriptors looked up
        once), the served call counted. What a custom op in a compiled graph, a compiled scope's
        served call and a chain site pay per call, where the general path's conversions and
        lookups would cost the host more than the launch itself. It returns ``NOT_SERVED`` for
        whatever it does not check itself (the card switched off, another shape or device), which
        the general path then counts, and None where the kernel failed (counted, switched off)."""
        self._lean_tried = True
        kernel = self._kernel
        if kernel is None or len(self.sig.outputs) != 1:
            return
        bound = kernel.bind(0)
        if bound is None:
            return
        status, board, specs, n = self.status, self.board, self._specs, len(self._specs)
        on_cuda = self.device == "cuda"

        def lean(tensors: list[Any]) -> Any:
            if not status.active or len(tensors) != n:
                return NOT_SERVED
            for t, (dtype, shape, stride) in zip(tensors, specs):
                if not (t.is_cuda if on_cuda else t.is_cpu) or t.dtype is not dtype or t.shape != shape or \
                        (t.stride() != stride and t.numel() > 1):
                    return NOT_SERVED
            try:
                out = bound(tensors, 0)
            except KERNEL_ERRORS as exc:
                self.kernel_failed(exc)
                return None
            board.served(status)
            return [out]

        self._lean = lean


KERNEL_ERRORS = (KernelError, RuntimeError, ValueError)
"""What a served kernel's call may raise: the card is switched off and the call falls back."""

MISS_MEMO = 32
"""Refused calls remembered per module card or leaf module, at most (``graph.call_key``). A call at
shapes the cards were not profiled at (a generation loop's steps, another resolution) would
otherwise go through every check, and a leaf module's through the interceptor, each time, costing
the host several times eager's own call."""


NOT_SERVED = object()


FELL_BACK = object()


TIME_EAGER = object()
"""A guard wants eager's own call timed in the kernel's place (``Guard.eager_pending``): a learned
leaf site's (the leaf's forward) or an intercepted op's (the op)."""


def load_consts(folder: Path, entry: Entry, device: str) -> list["torch.Tensor"]:
    import torch

    n = sum(1 for s in entry.signature.inputs if s.role == "const")
    if n == 0:
        return []
    path = folder / entry.card / "consts.pt"
    if not path.is_file():
        raise KernelUnavailable(f"its {n} constant inputs were not saved with it")
    vals = torch.load(path, map_location=device, weights_only=True)
    return [v.to(device) for v in vals]


def gated(served: Callable[..., Any], original: Callable[..., Any], guards: list[Guard],
           trial: Trial | None, servable: Callable[[tuple[Any, ...], dict[str, Any]], bool] | None = None,
           take_out: Callable[[Callable[..., Any]], bool] | None = None) -> Callable[..., Any]:
    """A scope's forward: ``original`` once every guard of the scope is off (and, at the first
    such call, ``take_out`` asked to put the module's own forward back), the two tried in
    place while the ``trial`` is pending (on the calls ``servable`` accepts, where given: those the
    kernels can serve), else ``served``."""
    out_tried: list[bool] = []

    def off(new: Callable[..., Any]) -> None:
        if take_out is not None and not out_tried:
            out_tried.append(True)
            take_out(new)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not any(g.status.active for g in guards):
            off(forward)
            return original(*args, **kwargs)
        if trial is not None and trial.pending() and (servable is None or servable(args, kwargs)):
            return trial.run(lambda: served(*args, **kwargs), lambda: original(*args, **kwargs))
        return served(*args, **kwargs)

    if len(guards) == 1 and trial is None:
        status = guards[0].status

        def forward_one(*args: Any, **kwargs: Any) -> Any:  # the same, for the common case
            if not status.active:
                off(forward_one)
                return original(*args, **kwargs)
            return served(*args, **kwargs)

        return forward_one
    return forward
