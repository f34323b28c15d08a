"""Calls of a model that forge's forwards serve nothing in run as written (``Passthrough``).

A generation loop calls the model once a step. Where the cards were profiled at the prompt's
shapes, every decode step passes through forge's forwards (a module card's, a scope's) only to be
refused and run the module's own code: a frame and a lookup each, several percent of a small
step's host time. ``Passthrough`` sits on the model's own forward and watches its calls by their
lead tensor (the first positional one, else the first of the forward's parameters passed one).
Once two calls in a row with the same lead served no card and counted the same fallbacks, every
one of them a refusal its forward remembered (``status.Tally``: a shape refused before, not one
being judged, learned or held back for the dispatch check), the calls that follow with that lead
run with forge's forwards put back to the modules' own (``ReplacedForwards.suspend``), their
fallbacks counted as the learned call counted them. A call with another lead (the next prompt's
prefill) ends the run: forge's forwards are set again and the learning starts over. Every
``RECHECK``-th call of a pass-through run is watched again, and one that serves or counts
otherwise ends the run too: a step whose shapes come into a range card's range (a prompt shorter
than the profiled one) is served from then on.

Only in inference mode (op by op), never while Dynamo traces or a CUDA graph captures, and not
with grad enabled. A run's passed calls are not counted in the scopes' own call counts (the
status's per-scope lines). A model called on several threads at once may run a call through
forge's forwards or past them while another swaps them: either computes the model's own result.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Callable

from .status import StatusBoard


class _Plan:
    """What a passed call counts: per (reason, count a call) the tally of the cards that fell back
    so, and how many calls of the run were passed through."""

    __slots__ = ("calls", "events", "tallies")

    def __init__(self, tallies: list[tuple[Any, int]], events: int) -> None:
        self.tallies = tallies
        self.events = events
        """Fallback events the learned call counted (``StatusBoard.fallback_events``)."""
        self.calls = 0


class Passthrough:
    LEARN = 2
    """Calls in a row with one lead that serve nothing and count alike before the run passes through."""
    RECHECK = 32
    """Every this many calls of a pass-through run, one is watched: a step that would serve ends
    the run. A watched call costs what forge's forwards cost, two swaps of them and two counts
    read: on the tiny decoder's seven forwards 44 Python-level calls where a passed call makes 4,
    so 5.3 a step on average (1.7% of eager's 315); it serves a step come into a card's range at
    most 31 steps late."""

    def __init__(self, model: Any, board: StatusBoard, suspend: Callable[[Callable[..., Any]], None],
                 resume: Callable[[Callable[..., Any]], None]) -> None:
        import torch

        self.board = board
        self._suspend_all, self._resume_all = suspend, resume
        self.inner: Callable[..., Any] = model.__dict__.get("forward") or types.MethodType(type(model).forward, model)
        """The model's own forward (forge sets no forward on the model itself where this is used)."""
        try:
            params = list(inspect.signature(self.inner).parameters)
        except (TypeError, ValueError):
            params = []
        self._order = params
        self._tensor = torch.Tensor
        self._grad = torch.is_grad_enabled
        self._compiling = torch.compiler.is_compiling
        self._cuda = torch.cuda.is_available()
        self._capturing = torch.cuda.is_current_stream_capturing
        self.lead: Any = None
        """The lead of the run of calls now going on."""
        self.streak = 0
        self.last: tuple[int, dict[tuple[str, str], int]] | None = None
        """The last watched call of the run: its fallback events and counts by (card, reason)."""
        self.plan: _Plan | None = None
        self.suspended = False
        self.depth = 0
        self.passed_calls = 0
        """Calls run as written, over all runs."""
        self.runs = 0
        """Runs that passed through."""
        self._tallies: dict[tuple[str, tuple[str, ...]], Any] = {}
        """The tallies the plans count passed calls by, per reason and cards (``_plan``)."""
        self.serving: Any = None
        """The lead of the last watched call that served: the next call with it is watched by
        the served count alone (it serves again, most likely), without reading the fallbacks."""
        self.call: Callable[..., Any] = self.forward
        """The forward set on the model (one bound method: what ``suspend`` keeps by identity)."""

    def _lead(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensor = self._tensor
        if args:
            x = args[0]
            return (x.shape, x.dtype) if isinstance(x, tensor) else None
        for name in self._order:
            x = kwargs.get(name)
            if isinstance(x, tensor):
                return x.shape, x.dtype
        return None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # traced by Dynamo (a model compiled after apply): the forward as written, forge's
        # forwards as they are, nothing of this object's state read (each would be a guard, and
        # its counts change at every call); the model calling itself: as the outer call runs it
        if self._compiling() or self.depth:
            return self.inner(*args, **kwargs)
        if args and type(x := args[0]) is self._tensor:  # the common case, without a frame
            lead: Any = (x.shape, x.dtype)
        else:
            lead = self._lead(args, kwargs)
        plan = self.plan
        if plan is not None and lead == self.lead and not self._grad():
            plan.calls += 1
            if plan.calls % self.RECHECK and (self.suspended or self._suspend()):
                for tally, k in plan.tallies:
                    tally.n += k
                self.passed_calls += 1
                self.depth = 1
                try:
                    return self.inner(*args, **kwargs)
                finally:
                    self.depth = 0
        return self._watched(lead, args, kwargs)

    def _watched(self, lead: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call through forge's forwards, and what it teaches about its run."""
        if self.suspended and not self._resume():
            return self.inner(*args, **kwargs)  # traced or captured: as written, nothing learned
        if lead != self.lead:
            self.lead, self.streak, self.last, self.plan = lead, 0, None, None
        board, grad = self.board, self._grad()
        if lead is not None and lead == self.serving:  # a model whose calls serve: one count read
            served = board.served_total
            self.depth = 1
            try:
                out = self.inner(*args, **kwargs)
            finally:
                self.depth = 0
            if board.served_total == served:
                self.serving = None  # the next call with it is watched in full
            return out
        served, (direct, tallied) = board.served_total, board.fallback_events()
        self.depth = 1
        try:
            out = self.inner(*args, **kwargs)
        finally:
            self.depth = 0
        if lead is None or grad:
            return out
        direct_after, tallied_after = board.fallback_events()
        events = tallied_after - tallied
        if board.served_total != served or direct_after != direct or not events:
            # served, or refused by a guard still judging or learning (or holding a call back
            # for a reason of its own): not a call that forge's forwards would refuse the same
            # way at once
            self.streak, self.last, self.plan = 0, None, None
            if board.served_total != served:
                self.serving = lead
            return out
        plan = self.plan
        if plan is not None:  # a recheck of a pass-through run
            if events != plan.events:
                self.streak, self.last, self.plan = 0, None, None
            else:
                self._suspend()  # the next call passes through at once
            return out
        counts = board.fallback_counts()
        last = self.last
        if last is not None and last[0] == events:
            self.streak += 1
            step = {key: n - last[1].get(key, 0) for key, n in counts.items() if n != last[1].get(key, 0)}
            if self.streak >= self.LEARN - 1 and sum(step.values()) > 0:
                self.plan = self._plan(step, events)
                self.runs += 1
                self._suspend()
        else:
            self.streak = 0
        self.last = (events, counts)
        return out

    def _plan(self, step: dict[tuple[str, str], int], events: int) -> _Plan:
        """Tallies that count a passed call as ``step`` (fallbacks by (card, reason)) counted one:
        one for each reason and set of cards, kept for the runs to come (every generation learns
        its decode steps' plan again)."""
        groups: dict[tuple[str, int], list[str]] = {}
        for (card, why), k in step.items():
            groups.setdefault((why, k), []).append(card)
        tallies = []
        for (why, k), cards in groups.items():
            key = (why, tuple(sorted(cards)))
            if key not in self._tallies:
                self._tallies[key] = self.board.tally([self.board.cards[c] for c in key[1]], why)
            tallies.append((self._tallies[key], k))
        return _Plan(tallies, events)

    def _tracing(self) -> bool:
        """Whether Dynamo traces or a CUDA graph captures now: forwards are then never swapped."""
        return bool(self._compiling() or (self._cuda and self._capturing()))

    def _suspend(self) -> bool:
        if self._tracing():
            return False
        self._suspend_all(self.call)
        self.suspended = True
        return True

    def _resume(self) -> bool:
        if self._tracing():
            return False
        self._resume_all(self.call)
        self.suspended = False
        return True


