"""A module's attributes, compared at each served call without a loop in Python per attribute."""

from __future__ import annotations

from typing import Any, Callable

PLAIN_ATTR = (type(None), bool, int, float, str)


def module_attrs(module: Any) -> tuple[tuple[str, Any, bool], ...]:
    """A module's attributes as (name, value, False) for plain values (eps, num_groups, training)
    and (name, id, True) for the rest (compared as the same objects, ``attrs_check``)."""
    out = []
    for k, v in module.__dict__.items():
        if type(v) in PLAIN_ATTR or (type(v) is tuple and all(type(x) in PLAIN_ATTR for x in v)):
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
