"""Op cards: an aten call matched against the card's recorded call, by its tensors and arguments."""

from __future__ import annotations

import time
from typing import Any

from ..program import encode, resolve_op
from .guard import TIME_EAGER, Guard


# ---- op cards ----------------------------------------------------------------------------------
class OpGuard:
    """An op card: matches an aten call by its tensors and its encoded arguments."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        node = guard.sig.program["nodes"][0]
        self.func = resolve_op(node["op"])
        self.args, self.kwargs = node["args"], node.get("kwargs", {})
        out_meta = node.get("out")
        self.single = not isinstance(out_meta, list) or len(out_meta) == 1

        self._flat = flat_pattern(self.args, self.kwargs)

    def _match_flat(self, args: Any, kwargs: Any) -> list[Any] | None:
        """The call's distinct tensors when it is the profiled call, matched without encoding it;
        None when the card's arguments are not flat (see ``flat_pattern``) or the call is not a
        plain match, and the encoding path decides (and says why)."""
        assert self._flat is not None
        slots, kw = self._flat
        if len(args) != len(slots) or len(kwargs) != len(kw):
            return None
        import torch

        uniq: list[Any] = []
        for a, (k, value) in zip(args, slots):
            if k >= 0:
                if not isinstance(a, torch.Tensor):
                    return None
                if k == len(uniq):
                    for u in uniq:  # a new input: not a tensor seen already
                        if u is a:
                            return None
                    uniq.append(a)
                elif k > len(uniq) or uniq[k] is not a:
                    return None
            elif not plain_equal(a, value):
                return None
        for key, value in kw.items():
            if key not in kwargs or not plain_equal(kwargs[key], value):
                return None
        return uniq

    def try_serve(self, args: Any, kwargs: Any, served_inputs: list[Any] | None = None) -> tuple[Any, Any]:
        """(the op's result, None) when the kernel served the call; (None, why not) otherwise, or
        (None, ``TIME_EAGER``) for a call that matched while the guard wants eager's own op timed
        in the kernel's place. ``served_inputs``: a list that receives the call's distinct tensors
        when it is served."""
        guard = self.guard
        if not guard.status.active:  # switched off: nothing to match
            return None, "disabled"
        t0 = time.perf_counter_ns() if guard.timing() else 0
        uniq = self._match_flat(args, kwargs) if self._flat is not None else None
        if uniq is not None:
            why = guard.mismatch(uniq)
            if why:
                return None, why
        else:
            uniq = []
            index: dict[int, int] = {}

            def ref(t: Any) -> dict[str, int]:
                k = index.get(id(t))
                if k is None:
                    k = index[id(t)] = len(uniq)
                    uniq.append(t)
                return {"$in": k}

            try:
                enc_args, enc_kwargs = encode(list(args), ref), encode(dict(kwargs), ref)
            except Exception:  # noqa: BLE001 - no JSON form: not the profiled call
                return None, "arguments differ"
            why = guard.mismatch(uniq)
            if why:
                return None, why
            if enc_args != self.args or enc_kwargs != self.kwargs:
                return None, "arguments differ"
        if guard.eager_pending:
            return None, TIME_EAGER
        outs = guard.serve(uniq, checked_at=t0)
        if outs is None:
            return None, ""  # counted by serve
        if served_inputs is not None:
            served_inputs.extend(uniq)
        return (outs[0] if self.single else tuple(outs)), None


_PLAIN = (type(None), bool, int, float, str)


def _plain_value(v: Any) -> bool:
    """A recorded argument that a call's value can be compared with directly: None, a bool, int,
    string, a finite float (encode tags the others), or a list of them."""
    if isinstance(v, list):
        return all(type(x) in _PLAIN for x in v)
    return type(v) in _PLAIN


def plain_equal(a: Any, recorded: Any) -> bool:
    """What ``encode(a) == recorded`` says for a recorded plain value, without encoding ``a``;
    a call's value of any other type (a tensor, a NumPy number) is not a match here."""
    if isinstance(recorded, list):
        return type(a) in (list, tuple) and len(a) == len(recorded) and \
            all(type(x) in _PLAIN and x == r for x, r in zip(a, recorded))
    return type(a) in _PLAIN and a == recorded


def flat_pattern(args: Any, kwargs: Any) -> tuple[list[tuple[int, Any]], dict[str, Any]] | None:
    """The recorded arguments as slots, when every positional one is a tensor reference or a plain
    value and every keyword one a plain value: (per position, (its input index, or -1 and the
    value)), the keyword values. None for anything else (tagged values, nested tensors)."""
    slots: list[tuple[int, Any]] = []
    for a in args:
        if isinstance(a, dict) and set(a) == {"$in"}:
            slots.append((int(a["$in"]), None))
        elif _plain_value(a):
            slots.append((-1, a))
        else:
            return None
    if not all(_plain_value(v) for v in kwargs.values()):
        return None
    return slots, dict(kwargs)
