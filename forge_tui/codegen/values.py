"""The lazy values a card's program lowers to: each, asked for its element at an index (one
:class:`~.index.Index` per dimension), adds the nodes computing it to the builder's graph.
Pointwise ops, views (``ViewVal``: an index rewrite), joins, triangles and row reductions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .index import Index
from .ir import FLOATS

if TYPE_CHECKING:
    from .builder import Builder


class Unsupported(Exception):
    """The program (or one of its nodes) is outside what the generator expresses; the message is
    one line saying which op or which access pattern."""


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def dim_index(d: int, nd: int) -> int:
    """Dimension ``d`` of ``nd`` counted from the front (negative ``d`` counts from the back)."""
    return d + nd if d < 0 else d


class Val:
    shape: tuple[int, ...]
    dtype: str

    def __init__(self, shape, dtype: str, where: str = "") -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.where = where

    @property
    def numel(self) -> int:
        return numel(self.shape)

    def deps(self) -> list["Val"]:
        return []

    def at(self, b: "Builder", idx: tuple[Index, ...]) -> int:
        raise NotImplementedError


class LeafVal(Val):
    def __init__(self, k: int, shape, stride, dtype: str) -> None:
        super().__init__(shape, dtype, f"input {k}")
        self.k = k
        self.stride = list(stride)

    def at(self, b, idx):
        off = b.space.offset_of(list(idx), self.stride)
        return b.g.add("load", (), (self.k, off), self.dtype, varying="c" in off.vars())


class ConstVal(Val):
    def __init__(self, value, shape, dtype: str, where: str = "") -> None:
        super().__init__(shape, dtype, where)
        self.value = value

    def at(self, b, idx):
        return b.const(self.value, self.dtype)


class IotaVal(Val):
    """arange: start + step * i along the only dimension."""

    def __init__(self, start: int, step: int, n: int, dtype: str, where: str) -> None:
        super().__init__((n,), dtype, where)
        self.start, self.step = start, step

    def at(self, b, idx):
        e = b.space.offset(b.space.scale(idx[0], self.step), self.start)
        node = b.g.add("index", (), e, "int64", varying="c" in e.vars())
        return b.cast(node, self.dtype)


class PointVal(Val):
    def __init__(self, op: str, args: list, attr, dtype: str, shape, where: str) -> None:
        super().__init__(shape, dtype, where)
        self.op, self.args, self.attr = op, args, attr

    def deps(self):
        return [a for a in self.args if isinstance(a, Val)]

    def at(self, b, idx):
        ops = [b.pull(a, broadcast_index(idx, self.shape, a.shape)) if isinstance(a, Val) else Num(a) for a in self.args]
        return b.apply(self.op, ops, self.attr, self.dtype, self.where)


class ViewVal(Val):
    def __init__(self, src: Val, shape, fn: Callable[["Builder", tuple[Index, ...]], tuple[Index, ...]], where: str,
                 dtype: str | None = None) -> None:
        super().__init__(shape, dtype or src.dtype, where)
        self.src, self.fn = src, fn

    def deps(self):
        return [self.src]

    def at(self, b, idx):
        return b.pull(self.src, self.fn(b, idx))


class CatVal(Val):
    def __init__(self, parts: list[Val], dim: int, dtype: str, shape, where: str) -> None:
        super().__init__(shape, dtype, where)
        self.parts, self.dim = parts, dim

    def deps(self):
        return list(self.parts)

    def at(self, b, idx):
        sp = b.space
        i = idx[self.dim]
        values, conds = [], []
        start = 0
        for part in self.parts:
            s = part.shape[self.dim]
            if s == 0:
                continue
            # the part's index, wrapped into range where another part is selected (every load of
            # every part stays inside its tensor)
            w = (-(-start // s)) * s - start
            local = sp.mod(sp.offset(i, w), s)
            sub = tuple(local if d == self.dim else x for d, x in enumerate(idx))
            values.append(b.cast(b.pull(part, sub), self.dtype))
            start += s
            conds.append(start)
        out = values[-1]
        for v, end in zip(reversed(values[:-1]), reversed(conds[:-1])):
            c = b.g.add("icmp", (), (i, "<", sp.const(end)), "bool", varying="c" in i.vars())
            out = b.g.add("where", (c, v, out), None, self.dtype)
        return out


class TriVal(Val):
    """triu / tril: keep x where col - row >= diagonal (triu) or <= diagonal (tril), else 0."""

    def __init__(self, src: Val, diagonal: int, upper: bool, where: str) -> None:
        super().__init__(src.shape, src.dtype, where)
        self.src, self.diagonal, self.upper = src, diagonal, upper

    def deps(self):
        return [self.src]

    def at(self, b, idx):
        sp = b.space
        row, col = idx[-2], idx[-1]
        v = b.pull(self.src, idx)
        if self.upper:  # col >= row + d
            lhs, op, rhs = col, ">=", sp.offset(row, self.diagonal)
        else:  # col <= row + d, i.e. row >= col - d
            lhs, op, rhs = row, ">=", sp.offset(col, -self.diagonal)
        vary = "c" in lhs.vars() | rhs.vars()
        cond = b.g.add("icmp", (), (lhs, op, rhs), "bool", varying=vary)
        return b.g.add("where", (cond, v, b.const(0, self.dtype)), None, self.dtype)


class RedVal(Val):
    """A reduction over the last ``nred`` dimensions of ``src`` (a float value), in fp32."""

    def __init__(self, kind_: str, src: Val, nred: int, keepdim: bool, where: str) -> None:
        lead = src.shape[:len(src.shape) - nred]
        shape = tuple(lead) + ((1,) * nred if keepdim else ())
        super().__init__(shape, "float32", where)
        self.kind, self.src, self.nred, self.keepdim = kind_, src, nred, keepdim
        self.lead = tuple(lead)
        self.cols = numel(src.shape[len(lead):])

    def deps(self):
        return [self.src]

    def at(self, b, idx):
        node = b.reduction_node(self)
        lead = idx[:len(self.lead)]
        row = b.space.linearize(list(lead), self.lead)
        if not b.is_row(row):
            raise Unsupported(f"{self.where}: its result is read at another row than the one it reduces "
                              "(a transpose or a broadcast across rows after the reduction)")
        return node


def broadcast_index(idx: tuple[Index, ...], out_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Index, ...]:
    pad = len(out_shape) - len(shape)
    return tuple(Index() if s == 1 else idx[pad + d] for d, s in enumerate(shape))


class Num:
    """A Python number operand (not a node)."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value



def pointwise(op: str, args: list, dtype: str, where: str, attr=None) -> Val:
    shapes = [a.shape for a in args if isinstance(a, Val)]
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for d, size in enumerate(s):
            k = nd - len(s) + d
            if size != 1:
                if out[k] not in (1, size):
                    raise Unsupported(f"{where}: shapes {shapes} do not broadcast")
                out[k] = size
    return PointVal(op, args, attr, dtype, out, where)


def fin(op: str, args: list, dtype: str, where: str) -> Val:
    """The last step of a composite op: computed in fp32 (eager's opmath), rounded once to ``dtype``."""
    v = pointwise(op, args, "float32", where)
    return v if dtype == "float32" else pointwise("cast", [v], dtype, where)


def reduce_(kind_: str, v: Val, dims, keepdim: bool, where: str) -> RedVal:
    nd = len(v.shape)
    if v.dtype not in FLOATS:
        raise Unsupported(f"{where}: a reduction of a {v.dtype} tensor")
    ds = sorted({dim_index(d, nd) for d in dims}) if dims else list(range(nd))
    if nd == 0:
        ds = []
    if ds != list(range(nd - len(ds), nd)):
        raise Unsupported(f"{where}: reduces dims {ds} of a {list(v.shape)} tensor, not its last dims")
    if numel(v.shape[nd - len(ds):]) == 0:
        raise Unsupported(f"{where}: reduces empty rows")
    src = v if v.dtype == "float32" else PointVal("cast", [v], None, "float32", v.shape, where)
    return RedVal(kind_, src, len(ds), keepdim, where)

