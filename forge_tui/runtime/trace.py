"""Fallbacks that Dynamo's trace decides, counted where the compiled graph runs.

Where Dynamo traces a module card's forward (a model compiled after ``apply``, or a compiled
scope above the module) and the trace sends the call to PyTorch's own code, a count behind the
status board's lock, traced, would break the graph at every call of the module. The trace notes
the fallback instead (``note_traced``, run by Dynamo through ``comptime``): in a compiled scope's
trace the scope's graph counts it at every call (``TraceSinks.collecting``); in a model the user
compiled it is noted once per graph (``StatusBoard.traced_fallback``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable


class TraceSinks:
    """Where the trace's fallbacks go, one object for an ``apply``: the compiled scopes that trace
    its module cards' forwards open a sink while they trace (``open``/``close``), and ``note``
    puts a fallback in the innermost open one, or on the guard's status board where none is
    open."""

    def __init__(self) -> None:
        self._open: list[list[tuple[Any, str]]] = []

    def open(self, sink: list[tuple[Any, str]]) -> None:
        """A compiled scope's trace begins: its fallbacks go to ``sink`` until ``close``."""
        self._open.append(sink)

    def close(self) -> None:
        self._open.pop()

    def note(self, guard: Any, why: str) -> None:
        if self._open:
            self._open[-1].append((guard, why))
        else:
            guard.board.traced_fallback(guard.status, why)


class _Traced:
    """A module card's guard and the sinks its trace notes go to (``register``)."""

    __slots__ = ("guard", "sinks", "__weakref__")

    def __init__(self, guard: Any, sinks: TraceSinks) -> None:
        self.guard = guard
        self.sinks = sinks


_TRACED: "weakref.WeakValueDictionary[str, _Traced]" = weakref.WeakValueDictionary()
"""The guards whose forwards compiled graphs trace, by key, for ``note_traced``; each held alive
by the forward that registered it."""


def register(key: str, guard: Any, sinks: TraceSinks) -> object:
    """Make ``key`` name ``guard`` and its ``sinks`` for ``note_traced``; the caller keeps the
    returned object (the registration lasts while it is referenced)."""
    traced = _TRACED[key] = _Traced(guard, sinks)
    return traced


def note_traced(ctx: Any) -> None:
    """Run by Dynamo while it traces a module card's forward (``comptime``), where the trace sends
    the call to PyTorch's own code: the fallback goes to the guard's sinks. Reads the caller's
    locals ``key`` (``register``'s) and ``why``."""
    try:
        traced = _TRACED.get(ctx.get_local("key").as_python_constant())
        why = ctx.get_local("why").as_python_constant()
    except Exception:  # noqa: BLE001 - a note, never a reason for the trace to fail
        return
    if traced is not None:
        traced.sinks.note(traced.guard, why)


def comptime_hook() -> Callable[[Callable[[Any], None]], None] | None:
    try:
        from torch._dynamo.comptime import comptime
    except ImportError:  # this torch has none: compiled graphs leave their fallbacks unrecorded
        return None
    return comptime  # type: ignore[no-any-return]
