"""Chain cards: ops a module's own forward calls one after another, served as one kernel where
the card's scope runs them (``chain.py``), or in the graphs of a model compiled with
``Applied.backend()``."""

from __future__ import annotations

from ...cards import not_served
from ..chain import ChainGuard
from ..install import Install, compiled_graph_why_not
from ..manifest import Entry
from ..mode import Mode
from ..opmatch import plain_equal


def why_not(entry: Entry, inst: Install) -> str | None:
    if inst.mode == Mode.TORCH_COMPILE and (why := compiled_graph_why_not(entry)) is not None:
        return why
    return not_served(entry.signature.kind, entry.signature.flags)


def install(inst: Install, entries: list[Entry]) -> None:
    for entry in entries:
        guard = inst.new_guard(entry)
        if guard is None:
            continue
        if inst.mode == Mode.TORCH_COMPILE:
            inst.serve_in_compiled_graphs(guard)
        else:
            inst.add_to_scopes(guard, ChainGuard(guard, plain_equal), "a chain")
