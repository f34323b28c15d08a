"""A call's key (its tensors' specs and its plain values) and its lead (its first tensor's shape).

A compiled scope knows its variants by the key of the call that compiled each; a profile records
the calls a card's ops were made in as the key's text (``key_text``); a refused call is
remembered by its key (``MissMemo``, module cards).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..direct import lead_place, param_rank


class Leads:
    """The leads (``call_lead``: the first tensor's shape and dtype) of a scope's calls: those its
    cards' ops were profiled in, those whose calls served a card, and those whose calls served none.
    A call whose lead is among the last alone (``unlike``) is one no card serves, as far as a look at
    its first tensor can tell: a decode step's, where the cards were profiled at a prompt's shapes."""

    def __init__(self, profiled: Iterable[str] = (), forward: Any = None) -> None:
        self.rank: dict[str, int] = param_rank(forward) if forward is not None else {}
        """The scope forward's parameters by their place (``direct.param_rank``): which keyword
        tensor leads a call passed by keywords alone."""
        self._order = sorted(self.rank, key=self.rank.__getitem__)
        leads = [_text_lead(t, self.rank) for t in frozenset(profiled)]
        self.profiled_leads: frozenset[Any] = frozenset(lead for lead in leads if lead is not None)
        self.lead_rule = bool(leads) and _UNREAD not in leads
        """Whether ``unlike`` may answer yes: only where the profiled calls are recorded and read
        back (a workspace profiled before they were has none: a warm-up call with the profiled
        call's lead and another mask could otherwise keep the profiled call from being served)."""
        self.serving_leads: set[Any] = set()
        self.empty_leads: set[Any] = set()
        self.refused: set[Any] = set()
        """Leads found ``unlike``, in the form a caller's own lookup builds, ``(t.shape, t.dtype)``
        (a ``torch.Size`` hashes and compares as the tuple): what a scope's forward looks up before
        anything else (``placement.refusing``). A lead leaves it once a call with it serves."""

    def unlike(self, lead: Any) -> bool:
        """Whether a call with this lead is one no card serves, as far as the leads can tell
        without its key: a call with the lead served nothing, none with it served, nor was one
        profiled with it. The cards' ops, whose shapes follow from the call's tensors, were not
        found at this one's."""
        return self.lead_rule and lead in self.empty_leads and lead not in self.serving_leads and \
            lead not in self.profiled_leads

    def lead(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``call_lead`` of a call of the scope's forward: for a call by keywords, the first of the
        forward's parameters it passes a tensor for, looked up in their order (a decode step's
        call passes its first parameter's tensor: one lookup, not a sort of its keywords)."""
        if not args:
            import torch

            for name in self._order:
                t = kwargs.get(name)
                if isinstance(t, torch.Tensor):
                    return tuple(t.shape), t.dtype
        return call_lead(args, kwargs, self.rank)

    def note(self, lead: Any, served: bool) -> None:
        """A call with this lead served a card, or none."""
        if lead is not None:
            (self.serving_leads if served else self.empty_leads).add(lead)
            if served:
                self.refused.discard(lead)


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call's key for ``VariantBook`` (and for a refusal ``apply`` remembers): each tensor's
    dtype, shape, strides and device type, inside tuples and lists too; plain values as they are;
    any other object by its type (a cache object whose contents grow at each step keys alike at
    every step)."""
    tensor = _TENSOR or _tensor_type()
    if not kwargs and all(type(a) is tensor for a in args):  # the common case (a refused call's)
        try:
            return tuple((a.dtype, a.shape, a.stride(), a.device.type) for a in args), ()
        except RuntimeError:  # a tensor without sizes (a nested one): the general form below
            pass
    return tuple([_key_of(a) for a in args]), tuple(sorted([(k, _key_of(v)) for k, v in kwargs.items()]))


_PLAIN_TYPES = frozenset({bool, int, float, str, type(None)})


def _key_of(v: Any) -> Any:
    """One argument's part of ``call_key`` (``_TENSOR`` set)."""
    t = type(v)
    if t in _PLAIN_TYPES:
        return v
    if t is _TENSOR or isinstance(v, _TENSOR):
        try:
            return (v.dtype, v.shape, v.stride(), v.device.type)
        except RuntimeError:  # no sizes or strides (a nested tensor): its kind instead
            return (v.dtype, v.layout, t, v.device.type)
    if t is tuple or t is list or isinstance(v, (tuple, list)):
        return (t, tuple([_key_of(x) for x in v]))
    if isinstance(v, (bool, int, float, str)):  # a subclass (an IntEnum's member)
        return v
    return t


def key_text(key: Any) -> str:
    """``call_key``'s key as text, the same in every process (dtypes and types by name): how a
    profile records the calls a card's ops were made in (``VariantBook.profiled``)."""

    def norm(v: Any) -> Any:
        if isinstance(v, tuple):  # torch.Size too
            return tuple(norm(x) for x in v)
        if isinstance(v, type):
            return f"{v.__module__}.{v.__qualname__}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"float {v}"  # inf and nan as text: the key reads back (``_text_lead``)
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return str(v)  # a dtype

    return repr(norm(key))


def call_lead(args: tuple[Any, ...], kwargs: dict[str, Any], rank: Any = None) -> Any:
    """A call's lead tensor (``direct.lead_place``, the forward's parameters ranked by ``rank``) by
    its shape and dtype; None where it passes no tensor."""
    place = lead_place(args, kwargs, rank)
    if place is None:
        return None
    i, name = place
    if i is not None:
        t = args[i]
    else:
        assert name is not None
        t = kwargs[name]
    return tuple(t.shape), t.dtype


_UNREAD = object()


def _text_lead(text: str, rank: Any = None) -> Any:
    """``call_lead`` of the call a ``key_text`` stands for (``rank`` as there): None where it passed
    no tensor, ``_UNREAD`` where the text does not read back."""
    import ast

    import torch

    def spec(v: Any) -> Any:
        if isinstance(v, tuple) and len(v) == 4 and isinstance(v[0], str) and v[0].startswith("torch.") \
                and isinstance(v[1], tuple):
            dtype = getattr(torch, v[0].removeprefix("torch."), None)
            return (v[1], dtype) if isinstance(dtype, torch.dtype) else None
        return None

    try:
        args, kwargs = ast.literal_eval(text)
        for a in args:
            if (lead := spec(a)) is not None:
                return lead
        last = len(rank or ())
        named = sorted(kwargs, key=lambda kv: ((rank or {}).get(kv[0], last), kv[0]))  # the forward's order, then by name
        for _, v in named:
            if (lead := spec(v)) is not None:
                return lead
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _UNREAD
    return None


_TENSOR: Any = None


def _tensor_type() -> Any:
    global _TENSOR
    import torch

    _TENSOR = torch.Tensor
    return _TENSOR
