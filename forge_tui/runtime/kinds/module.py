"""Module cards: the forward of each leaf module a card was profiled at, replaced by one that
serves the card's kernel through its guard (``module_card.py``)."""

from __future__ import annotations

import functools

from ...cards import not_served
from ..attrs import card_values
from ..graph.backend import compile_worthy
from ..install import Install
from ..manifest import Entry
from ..mode import Mode
from ..module_card import module_forward
from ..trial import Trial

UNRECORDED = ("not served: its profile recorded none of the module's attributes (its eps, its training flag), "
              "which the kernel may have compiled in; profile the workload again")


def why_not(entry: Entry, inst: Install) -> str | None:
    sig = entry.signature
    if sig.returns == "other":
        return "the module returns something other than a tensor or a tuple of them"
    if inst.mode == Mode.TORCH_COMPILE and (why := compile_worthy(sig.program)) is not None:
        return f"not served under torch.compile: {why}"
    return not_served(sig.kind, sig.flags)


def install(inst: Install, entries: list[Entry]) -> None:
    applied, mode = inst.applied, inst.mode
    for entry in entries:
        guard = inst.new_guard(entry)
        if guard is None:
            continue
        sig = guard.sig
        if inst.trial_calls > 0:
            guard.trial = Trial(inst.trial_calls, inst.device, guard.decide)
        unrecorded = []
        for path in sig.module_paths:
            module = inst.module_at(path)
            if module is None:
                continue
            recorded = sig.module_attrs.get(path)
            if recorded is None:  # nothing to compare its attributes with: its kernel may compute another eps
                unrecorded.append(path)
                continue
            fwd = module_forward(module, module.forward, guard, mode, sig.call_args, sig.returns, card_values(recorded),
                                 take_out=functools.partial(applied.take_out, module) if mode == Mode.INFERENCE else None,
                                 sinks=applied.trace)
            applied._replace_forward(module, fwd)
            if mode != Mode.TORCH_COMPILE:
                applied.in_graph.add(id(fwd))
            guard.status.sites.append(path)
        if guard.status.sites:
            applied.guards[entry.card] = guard
            guard.status.sites.extend(f"{path}: {UNRECORDED}" for path in unrecorded)
        elif unrecorded:
            inst.skip(entry.card, f"{UNRECORDED}: {', '.join(unrecorded[:3])}")
        else:
            inst.skip(entry.card, "none of its modules is in this model: " + ", ".join(sig.module_paths[:3]))
