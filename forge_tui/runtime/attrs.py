"""A module's attributes, compared at each served call without a loop in Python per attribute.

A module card's kernel computes what its module's forward computed when the profile recorded it:
an ``eps`` or a scale the forward read is a constant of the kernel, and a forward that reads its
training flag computed the profiled mode's values. The profile records the module's plain
attributes at the call (``recorded_attrs``, on the card as ``Card.module_attrs``), and every
served call compares the module's attributes with those (``card_check`` op by op,
``traced_check`` where Dynamo traces the forward), so that a module whose attributes differ from
the profile's, whenever they changed, runs its own forward.
"""

from __future__ import annotations

import math
from typing import Any, Callable

PLAIN_ATTR = (type(None), bool, int, float, str)


def plain(v: Any) -> bool:
    """A value compared by equality: a PLAIN_ATTR value or a tuple of them; anything else is
    compared as the same object."""
    return type(v) in PLAIN_ATTR or (type(v) is tuple and all(type(x) in PLAIN_ATTR for x in v))


def module_attrs(module: Any) -> tuple[tuple[str, Any, bool], ...]:
    """A module's attributes as (name, value, False) for plain values (eps, num_groups, training)
    and (name, id, True) for the rest (compared as the same objects, ``attrs_check``)."""
    out = []
    for k, v in module.__dict__.items():
        if plain(v):
            out.append((k, v, False))
        else:
            out.append((k, id(v), True))
    return tuple(out)


def attrs_check(attrs: tuple[tuple[str, Any, bool], ...], d: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether a module's ``__dict__`` still holds ``attrs`` (``LeafSites._attrs``, taken from
    ``d`` as it is now): the same names, the plain values equal, the others the same objects
    (kept here, compared with ``is``). One lookup of all the names at once, compared as tuples:
    a module has some twenty attributes, and comparing them one by one in Python cost more host
    time than the kernel's own dispatch."""
    import operator

    n = len(attrs)
    plain_keys = tuple(k for k, _, by_id in attrs if not by_id)
    plain = tuple(v for _, v, by_id in attrs if not by_id)
    obj_keys = tuple(k for k, _, by_id in attrs if by_id)
    objs = tuple(d[k] for k in obj_keys)
    if tuple(map(id, objs)) != tuple(v for _, v, by_id in attrs if by_id):
        raise ValueError("the attributes were not taken from this __dict__")
    get_plain = operator.itemgetter(*plain_keys) if plain_keys else None
    get_objs = operator.itemgetter(*obj_keys) if obj_keys else None
    one_plain, one_obj = len(plain_keys) == 1, len(obj_keys) == 1
    is_ = operator.is_

    def same(d: dict[str, Any]) -> bool:
        if len(d) != n:
            return False
        try:
            if get_plain is not None:
                got = get_plain(d)
                if ((got,) if one_plain else got) != plain:
                    return False
            if get_objs is not None:
                got = get_objs(d)
                if not all(map(is_, (got,) if one_obj else got, objs)):
                    return False
        except KeyError:
            return False
        return True

    return same


def recorded_attrs(module: Any) -> dict[str, Any]:
    """The module's plain attributes (``plain``: an eps, a scale, the training flag) as JSON, as a
    profile records them for a module card: tuples as lists, a non-finite float as
    ``{"$float": "inf"}`` (``card_values`` reads them back)."""
    return {k: _json(v) for k, v in module.__dict__.items() if plain(v)}


def _json(v: Any) -> Any:
    if type(v) is tuple:
        return [_json(x) for x in v]
    if type(v) is float and not math.isfinite(v):
        return {"$float": str(v)}
    return v


def card_values(recorded: dict[str, Any]) -> dict[str, Any]:
    """``recorded_attrs``' JSON read back as the module holds the values."""
    return {k: _value(v) for k, v in recorded.items()}


def _value(v: Any) -> Any:
    if type(v) is list:
        return tuple(_value(x) for x in v)
    if type(v) is dict and set(v) == {"$float"}:
        return float(v["$float"])
    return v


class _NotRecorded:
    """The expected value of a plain attribute the profile did not record: equal to nothing."""

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


_NOT_RECORDED = _NotRecorded()


def card_check(module: Any, card: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether a module's ``__dict__`` holds the card's attributes (``card``: ``card_values`` of
    what the profile recorded): every plain attribute equal to the card's, and no other plain one
    (a plain attribute the profile did not record, or one it recorded that is no longer plain or
    no longer there, never matches); the other attributes the objects they are now (``attrs_check``:
    one lookup of all the names, compared as tuples, as cheap per call as a check against the
    module's own values)."""
    d = module.__dict__
    now = module_attrs(module)
    if any(k not in d or not plain(d[k]) for k in card):
        return lambda d: False
    return attrs_check(tuple((k, card.get(k, _NOT_RECORDED), False) if not by_id else (k, v, True)
                             for k, v, by_id in now), d)


def traced_check(card: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """``card_check``'s comparison of the plain attributes, written for Dynamo to trace: each
    attribute read from the module's ``__dict__`` and compared with the card's, so that Dynamo
    guards it and a compiled graph holds the kernel's call only while the module's attributes are
    the card's (where one changes, Dynamo's guard fails and the forward is traced again, taking
    the module's own forward). Only the recorded attributes are read: Dynamo guards what the trace
    reads, and a plain attribute the profile did not record is one the profiled forward did not
    have."""
    items = tuple(card.items())

    def same(d: dict[str, Any]) -> bool:
        for k, v in items:
            if k not in d:
                return False
            got = d[k]
            if not plain(got) or got != v:
                return False
        return True

    return same


def difference(d: dict[str, Any], card: dict[str, Any]) -> str:
    """Why a module's ``__dict__`` ``d`` fails ``card_check`` against ``card``, naming the first
    attribute that differs from the profile's."""
    for k, v in card.items():
        if k not in d:
            return f"its attribute {k} is gone (the profile's: {v!r})"
        if not plain(d[k]):
            return f"its attribute {k} is a {type(d[k]).__name__} (the profile's: {v!r})"
        if d[k] != v:
            return f"its attribute {k} is {d[k]!r} (the profile's: {v!r})"
    extra = next((k for k, v in d.items() if plain(v) and k not in card), None)
    if extra is not None:
        return f"its attribute {extra} was not recorded by the profile"
    return "its attributes changed since its first call"
