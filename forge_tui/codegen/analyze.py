"""From a card's aten program to a :class:`~.ir.Kernel`, or the one-line reason it cannot be.

Every aten call of the program becomes a lazy *value*: something that, asked for its element at
an index (one :class:`~.index.Index` per dimension), adds the nodes computing it to the graph.
Pointwise ops ask their operands at the broadcast index; views and slices (view, reshape,
permute, transpose, expand, unsqueeze, squeeze, slice, select, split, unbind, narrow, cat) only
rewrite the index; reductions over the last dimensions (sum, mean, amax, amin, var, std, norms,
softmax, layer and group norm, written as their fp32 steps) become row reductions. Nothing is
materialised.

The kernel's domain is ``rows x cols``: with reductions, cols is the length they reduce (all must
reduce rows of the same length) and every tensor of that size is read at its own row-major
flat position ``cols * r + c``; a reduction's result may then be read only at the row it reduced.
Without reductions the domain is the output's shape, cut where every access stays linear in
``c`` (a flat loop when nothing broadcasts).

Numerics follow eager: each op's result has the dtype eager recorded for it (its output meta)
and is rounded to it; operands are converted to the op's dtype first (as TensorIterator does),
Python numbers enter at fp32 (eager's opmath), composite ops (mean, var, softmax, layer norm)
keep their internal steps in fp32 and round once.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..cards import Card
from ..kernel_abi import ITEMSIZE
from .index import Atom, Index, IndexError_, Space, evaluate
from .ir import EXPLICIT, FLOAT_OPS, FLOATS, INTS, Graph, Kernel, Leaf, Output, kind


class Unsupported(Exception):
    """The program (or one of its nodes) is outside what the generator expresses; the message is
    one line saying which op or which access pattern."""


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---- values ------------------------------------------------------------------------------------
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


# ---- the builder ---------------------------------------------------------------------------------
class Builder:
    def __init__(self, space: Space, rows: int, cols: int, column: Index | None = None) -> None:
        self.space = space
        self.rows, self.cols = rows, cols
        self.g = Graph()
        self.memo: dict[tuple[int, tuple[Index, ...]], int] = {}
        self.red_nodes: dict[int, int] = {}
        self.flat = space.add(space.scale(space.var("r"), cols), column if column is not None else space.var("c"))
        """The element a (row, column) visits: ``column`` is the logical column as a function of
        the loop variable c (``column_order``), c itself by default."""
        self._rows_ok: dict[Index, bool] = {}

    def pull(self, v: Val, idx: tuple[Index, ...]) -> int:
        key = (id(v), tuple(idx))
        hit = self.memo.get(key)
        if hit is None:
            try:
                hit = v.at(self, tuple(idx))
            except IndexError_ as exc:
                raise Unsupported(f"{v.where}: {exc}") from None
            self.memo[key] = hit
        return hit

    def is_row(self, e: Index) -> bool:
        """Whether ``e`` is the row index r for every row (canonically, else checked row by row)."""
        r = self.space.var("r")
        if e == r:
            return True
        if e.vars() - {"r"}:
            return False
        ok = self._rows_ok.get(e)
        if ok is None:
            import torch

            rr = torch.arange(self.rows, dtype=torch.int64)
            got = evaluate(e, {"r": rr})
            ok = bool(torch.equal(torch.as_tensor(got, dtype=torch.int64).expand(self.rows), rr))
            self._rows_ok[e] = ok
        return ok

    def reduction_node(self, rv: RedVal) -> int:
        node = self.red_nodes.get(id(rv))
        if node is None:
            if rv.cols != self.cols or rv.src.numel != self.rows * self.cols:
                raise Unsupported(f"{rv.where}: reduces rows of {rv.cols} where the kernel's rows have {self.cols}")
            body = self.pull(rv.src, tuple(self.space.delinearize(self.flat, rv.src.shape)))
            body = self.cast(body, "float32")
            node = self.red_nodes[id(rv)] = self.g.reduction(rv.kind, body)
        return node

    # ---- scalars ---------------------------------------------------------------------------------
    def const(self, value, dtype: str) -> int:
        k = kind(dtype)
        if k == "f":
            v: Any = float(value)
        elif k == "i":
            v = int(value)
        else:
            v = bool(value)
        return self.g.add("const", (), v, dtype, varying=False)

    def cast(self, node: int, dtype: str, attr=None) -> int:
        """``attr``: EXPLICIT for the model's own casts (``.to``, ``type_as``, copies), which
        round in every ``math`` mode; None for an op's rounding of its result."""
        n = self.g.nodes[node]
        if n.dtype == dtype:
            return node
        src, dst = n.kind, kind(dtype)
        if src == "f" and dst == "i":
            raise Unsupported("a cast from floating point to an integer type")
        return self.g.add("cast", (node,), attr if src == "f" and dst == "f" else None, dtype)

    def apply(self, op: str, ops: list, attr, dtype: str, where: str) -> int:
        """The node of ``op`` on operand nodes (ints) or Python numbers, result of ``dtype``."""
        g = self.g
        if op == "cast":
            return self.cast(ops[0], dtype, attr)
        if op == "where":
            cond = self.operand(ops[0], "bool")
            return g.add("where", (cond, self.operand(ops[1], dtype), self.operand(ops[2], dtype)), None, dtype)
        k = kind(dtype)
        if op in ("logical_not", "logical_and", "logical_or", "logical_xor"):
            return g.add(op, tuple(self.operand(x, "bool") for x in ops), None, "bool")
        if k == "b":  # comparisons and predicates
            kinds = {_py_kind(x) if isinstance(x, Num) else self.g.nodes[x].kind for x in ops}
            if "f" in kinds:
                common = "float32"
            elif "i" in kinds:
                common = "int64"
            else:
                common = "bool"
            if common == "bool" and op not in ("eq", "ne"):
                common = "int64"
            return g.add(op, tuple(self.operand(x, common) for x in ops), attr, "bool")
        if k == "i":
            if op not in ("add", "sub", "mul", "neg", "abs", "maximum", "minimum"):
                raise Unsupported(f"{where}: integer {op}")
            return g.add(op, tuple(self.operand(x, "int64") for x in ops), None, dtype)
        if op not in FLOAT_OPS:
            raise Unsupported(f"{where}: no scalar form of {op}")
        return g.add(op, tuple(self.operand(x, dtype) for x in ops), attr, dtype)

    def operand(self, x, dtype: str) -> int:
        """An operand converted to the op's dtype (Python numbers: to the opmath type, unrounded)."""
        if isinstance(x, Num):
            k = kind(dtype)
            return self.const(x.value, "float32" if k == "f" else "int64" if k == "i" else "bool")
        return self.cast(x, dtype)


class Num:
    """A Python number operand (not a node)."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value


def _py_kind(x) -> str:
    x = x.value if isinstance(x, Num) else x
    if isinstance(x, bool):
        return "b"
    if isinstance(x, int):
        return "i"
    return "f"


# ---- the program -------------------------------------------------------------------------------
class Ctx:
    def __init__(self, card: Card) -> None:
        self.card = card
        self.env: dict[tuple[int, int], Val] = {}
        self.leaves = [LeafVal(k, s.shape, s.stride, s.dtype) for k, s in enumerate(card.inputs)]
        self.views: set[int] = set()  # nodes whose outputs are views
        self.viewed: set[tuple] = set()  # bases a view was taken of

    def ref(self, r: dict) -> Val:
        if "$in" in r:
            k = r["$in"]
            if k >= len(self.leaves):
                raise Unsupported(f"a reference to input {k}, which the card does not have")
            return self.leaves[k]
        key = (r["$node"], r.get("out", 0))
        v = self.env.get(key)
        if v is None:
            raise Unsupported(f"node {key[0]} output {key[1]} is not a tensor the generator computes")
        return v


def _decode(x, ctx: Ctx):
    if isinstance(x, list):
        return [_decode(v, ctx) for v in x]
    if isinstance(x, dict):
        if "$in" in x or "$node" in x:
            return ctx.ref(x)
        if "$dtype" in x:
            return ("dtype", x["$dtype"])
        if "$float" in x:
            return float(x["$float"])
        if "$device" in x or "$layout" in x or "$memory_format" in x:
            return ("tag", next(iter(x.values())))
        return {k: _decode(v, ctx) for k, v in x.items()}
    return x


def _bind(op_name: str, args: list, kwargs: dict) -> dict:
    from ..program import resolve_op

    try:
        schema = resolve_op(op_name)._schema
    except Exception as exc:  # noqa: BLE001 - an op this torch does not know
        raise Unsupported(f"{op_name} is not an op this PyTorch knows ({type(exc).__name__})") from None
    out: dict = {}
    for k, a in enumerate(schema.arguments):
        if k < len(args):
            out[a.name] = args[k]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def _dim(d: int, nd: int) -> int:
    return d + nd if d < 0 else d


def _dtype_arg(x) -> str | None:
    if isinstance(x, tuple) and x and x[0] == "dtype":
        return x[1]
    return None


def contiguous_strides(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))


def _infer_shape(shape: list[int], n: int) -> list[int]:
    shape = list(shape)
    if -1 in shape:
        known = numel([s for s in shape if s != -1])
        shape[shape.index(-1)] = n // known if known else 0
    return shape


def reshape(v: Val, shape, where: str) -> Val:
    shape = tuple(_infer_shape(list(shape), v.numel))
    if numel(shape) != v.numel:
        raise Unsupported(f"{where}: a view of {v.numel} elements as {list(shape)}")
    if shape == v.shape:
        return v
    src_shape = v.shape

    def fn(b, idx):
        sp = b.space
        return tuple(sp.delinearize(sp.linearize(list(idx), shape), src_shape))

    return ViewVal(v, shape, fn, where)


def permute(v: Val, perm: list[int], where: str) -> Val:
    nd = len(v.shape)
    perm = [_dim(p, nd) for p in perm]
    shape = tuple(v.shape[p] for p in perm)

    def fn(b, idx):
        src = [Index()] * nd
        for i, p in enumerate(perm):
            src[p] = idx[i]
        return tuple(src)

    return ViewVal(v, shape, fn, where)


def expand(v: Val, sizes: list[int], where: str) -> Val:
    pad = len(sizes) - len(v.shape)
    if pad < 0:
        raise Unsupported(f"{where}: expand to fewer dimensions")
    shape = []
    for d, s in enumerate(sizes):
        src = v.shape[d - pad] if d >= pad else 1
        shape.append(src if s == -1 else s)
        if d >= pad and src not in (1, shape[-1]):
            raise Unsupported(f"{where}: expand of size {src} to {s}")
    src_shape = v.shape

    def fn(b, idx):
        return tuple(Index() if src_shape[d] == 1 else idx[d + pad] for d in range(len(src_shape)))

    return ViewVal(v, shape, fn, where)


def unsqueeze(v: Val, dim: int, where: str) -> Val:
    nd = len(v.shape) + 1
    d = _dim(dim, nd)
    shape = v.shape[:d] + (1,) + v.shape[d:]
    return ViewVal(v, shape, lambda b, idx: tuple(x for k, x in enumerate(idx) if k != d), where)


def squeeze(v: Val, dims: list[int] | None, where: str) -> Val:
    nd = len(v.shape)
    drop = set(range(nd)) if dims is None else {_dim(d, nd) for d in dims}
    drop = {d for d in drop if v.shape[d] == 1}
    shape = tuple(s for d, s in enumerate(v.shape) if d not in drop)

    def fn(b, idx):
        it = iter(idx)
        return tuple(Index() if d in drop else next(it) for d in range(nd))

    return ViewVal(v, shape, fn, where)


def slice_(v: Val, dim: int, start, end, step: int, where: str) -> Val:
    nd = len(v.shape)
    d = _dim(dim, nd)
    size = v.shape[d]
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start, end = max(0, min(start, size)), max(0, min(end, size))
    if step < 1:
        raise Unsupported(f"{where}: a slice with step {step}")
    n = max(0, -(-(end - start) // step))
    shape = v.shape[:d] + (n,) + v.shape[d + 1:]

    def fn(b, idx):
        sp = b.space
        return tuple(sp.offset(sp.scale(x, step), start) if k == d else x for k, x in enumerate(idx))

    return ViewVal(v, shape, fn, where)


def select(v: Val, dim: int, index: int, where: str) -> Val:
    nd = len(v.shape)
    d = _dim(dim, nd)
    if index < 0:
        index += v.shape[d]
    shape = v.shape[:d] + v.shape[d + 1:]

    def fn(b, idx):
        return tuple(idx[:d]) + (b.space.const(index),) + tuple(idx[d:])

    return ViewVal(v, shape, fn, where)


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
    ds = sorted({_dim(d, nd) for d in dims}) if dims else list(range(nd))
    if nd == 0:
        ds = []
    if ds != list(range(nd - len(ds), nd)):
        raise Unsupported(f"{where}: reduces dims {ds} of a {list(v.shape)} tensor, not its last dims")
    if numel(v.shape[nd - len(ds):]) == 0:
        raise Unsupported(f"{where}: reduces empty rows")
    src = v if v.dtype == "float32" else PointVal("cast", [v], None, "float32", v.shape, where)
    return RedVal(kind_, src, len(ds), keepdim, where)


# ---- handlers ----------------------------------------------------------------------------------
UNARY = {"neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
         "sin", "cos", "tan", "tanh", "atan", "erf", "sigmoid", "silu", "relu", "mish", "hardsigmoid", "hardswish",
         "floor", "ceil", "round", "trunc", "sign", "square"}
BINARY = {"mul", "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor"}
IDENTITY_VIEWS = {"alias", "detach", "lift_fresh", "_conj", "view_as"}


CHAIN_LEFT_OUT = {"mm", "bmm", "cat", "split", "split_with_sizes", "unbind", "full", "full_like", "zeros", "ones",
                  "zeros_like", "ones_like", "arange", "scalar_tensor", "fill", "copy", "clone", "contiguous",
                  "lift_fresh_copy", "triu", "tril"}
"""Ops the generator lowers that no chain of ops starts or continues with: products, joins and
splits, allocations, copies (a chain is the pointwise, cast and reduction ops between them)."""


INDEX_LINKS = {"slice", "narrow", "select", "unsqueeze", "squeeze", "cat"}
"""Views and joins a chain expresses in its indexing, never copies (rotate-half's slices, negation
and ``cat``): links of a chain where they read its tensors, its inputs included; they never start
one (``index_link``)."""


def index_link(name: str) -> bool:
    """Whether the aten op ``name`` (``aten.slice.Tensor``) may be an index link of a chain: a view
    or a join that the generator lowers as index arithmetic (``INDEX_LINKS``)."""
    parts = name.split(".")
    return (parts[1] if len(parts) > 1 else name) in INDEX_LINKS


def chains_op(name: str) -> bool:
    """Whether the aten op ``name`` (``aten.mul.Tensor``) may be a link of a chain card: a
    pointwise op, a cast or a reduction the generator lowers, not in place, not a view."""
    parts = name.split(".")
    base = parts[1] if len(parts) > 1 else name
    if base.endswith("_") or base in CHAIN_LEFT_OUT:
        return False
    return base in UNARY or base in BINARY or (hasattr(Lowering, "op_" + base) and not _is_view_op(base))


def _is_view_op(base: str) -> bool:
    return base in IDENTITY_VIEWS or base in {"view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute",
                                              "transpose", "t", "unsqueeze", "squeeze", "slice", "narrow", "select"}


def _vals(xs) -> list[Val]:
    return [x for x in xs if isinstance(x, Val)]


class Lowering:
    """Turns each aten node into values; ``handle`` returns the node's outputs (None for
    non-tensor outputs)."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.reductions: list[RedVal] = []

    def handle(self, i: int, node: dict) -> list[Val | None]:
        name = node["op"]
        parts = name.split(".")
        base = parts[1] if len(parts) > 1 else name
        where = f"node {i} ({name})"
        inplace = base.endswith("_") and not base.endswith("__") and not base.startswith("_")
        if inplace:
            base = base[:-1]
        meta = node.get("out")
        if not meta:
            raise Unsupported(f"{where}: no output types recorded (capture it again)")
        args = _decode(node.get("args", []), self.ctx)
        kwargs = _decode(node.get("kwargs", {}), self.ctx)
        a = _bind(name, args, kwargs)
        fn = getattr(self, "op_" + base, None)
        if fn is None:
            if base in UNARY:
                fn = self._unary
            elif base in BINARY:
                fn = self._binary
            else:
                raise Unsupported(f"{where}: {base} is not a pointwise op, view or reduction the generator knows")
        out = fn(a, meta, where, base)
        if not isinstance(out, list):
            out = [out]
        for k, (v, m) in enumerate(zip(out, meta)):
            if v is None or m is None:
                continue
            if list(v.shape) != list(m[0]) or v.dtype != m[1]:
                raise Unsupported(f"{where}: output {k} computes as {list(v.shape)} {v.dtype} but eager made "
                                  f"{list(m[0])} {m[1]}")
        if inplace:
            self._check_inplace(i, node, where)
        return out

    def _check_inplace(self, i: int, node: dict, where: str) -> None:
        first = node["args"][0] if node.get("args") else None
        if isinstance(first, dict) and "$node" in first and first["$node"] in self.ctx.views:
            raise Unsupported(f"{where}: an in-place write through a view")
        key = ("in", first["$in"]) if isinstance(first, dict) and "$in" in first else \
            ("node", first.get("$node")) if isinstance(first, dict) else None
        if key in self.ctx.viewed:
            raise Unsupported(f"{where}: an in-place write to a tensor a view was taken of")

    @staticmethod
    def _out(meta, k=0) -> tuple[list[int], str]:
        m = meta[k]
        return list(m[0]), m[1]

    # ---- pointwise -------------------------------------------------------------------------------
    def _unary(self, a, meta, where, base):
        return pointwise(base, [a["self"]], self._out(meta)[1], where)

    def _binary(self, a, meta, where, base):
        return pointwise(base, [a["self"], a["other"]], self._out(meta)[1], where)

    def _addsub(self, a, meta, where, sign: str, reverse: bool = False):
        dtype = self._out(meta)[1]
        x, y, alpha = a["self"], a["other"], a.get("alpha", 1)
        if reverse:
            x, y = y, x
        if alpha is not None and alpha != 1:
            if isinstance(y, Val):
                # eager: self + alpha * other in opmath, rounded once
                y = pointwise("mul", [pointwise("cast", [y], dtype, where), alpha], "float32", where)
                x = pointwise("cast", [x], dtype, where) if isinstance(x, Val) else x
                return fin(sign, [x, y], dtype, where)
            y = y * alpha
        return pointwise(sign, [x, y], dtype, where)

    def op_add(self, a, meta, where, base):
        return self._addsub(a, meta, where, "add")

    def op_sub(self, a, meta, where, base):
        return self._addsub(a, meta, where, "sub")

    def op_rsub(self, a, meta, where, base):
        return self._addsub(a, meta, where, "sub", reverse=True)

    def op_div(self, a, meta, where, base):
        if a.get("rounding_mode") is not None:
            raise Unsupported(f"{where}: division with rounding_mode={a['rounding_mode']!r}")
        return pointwise("div", [a["self"], a["other"]], self._out(meta)[1], where)

    def op_true_divide(self, a, meta, where, base):
        return self.op_div(a, meta, where, base)

    def op_pow(self, a, meta, where, base):
        dtype = self._out(meta)[1]
        x, e = a.get("self"), a.get("exponent")
        if not isinstance(x, Val):  # pow.Scalar: a number to a tensor power
            return pointwise("pow", [x, e], dtype, where)
        if isinstance(e, Val):
            return pointwise("pow", [x, e], dtype, where)
        # eager's pow with a scalar exponent: the special cases it computes without pow()
        if e == 2:
            return pointwise("square", [x], dtype, where)
        if e == 1:
            return pointwise("cast", [x], dtype, where)
        if e == 0.5:
            return pointwise("sqrt", [x], dtype, where)
        if e == -0.5:
            return pointwise("rsqrt", [x], dtype, where)
        if e == -1:
            return pointwise("reciprocal", [x], dtype, where)
        if e == 3:
            return fin("mul", [pointwise("square", [x], "float32", where), x], dtype, where)
        if e == -2:
            return fin("reciprocal", [pointwise("square", [x], "float32", where)], dtype, where)
        return pointwise("pow", [x, e], dtype, where)

    def op_gelu(self, a, meta, where, base):
        approx = a.get("approximate") or "none"
        return pointwise("gelu_tanh" if approx == "tanh" else "gelu", [a["self"]], self._out(meta)[1], where)

    def op_softplus(self, a, meta, where, base):
        return pointwise("softplus", [a["self"]], self._out(meta)[1], where, (float(a["beta"]), float(a["threshold"])))

    def op_leaky_relu(self, a, meta, where, base):
        return pointwise("leaky_relu", [a["self"]], self._out(meta)[1], where, (float(a["negative_slope"]),))

    def op_elu(self, a, meta, where, base):
        return pointwise("elu", [a["self"]], self._out(meta)[1], where,
                         (float(a["alpha"]), float(a["scale"]), float(a["input_scale"])))

    def _clamp(self, x, lo, hi, dtype, where):
        if isinstance(lo, Val) or isinstance(hi, Val):
            out = x
            if lo is not None:
                out = pointwise("maximum", [out, lo], dtype, where)
            if hi is not None:
                out = pointwise("minimum", [out, hi], dtype, where)
            return out
        lo_f = -math.inf if lo is None else float(lo)
        hi_f = math.inf if hi is None else float(hi)
        return pointwise("clamp", [x], dtype, where, (lo_f, hi_f))

    def op_clamp(self, a, meta, where, base):
        return self._clamp(a["self"], a.get("min"), a.get("max"), self._out(meta)[1], where)

    def op_clip(self, a, meta, where, base):
        return self.op_clamp(a, meta, where, base)

    def op_clamp_min(self, a, meta, where, base):
        return self._clamp(a["self"], a.get("min"), None, self._out(meta)[1], where)

    def op_clamp_max(self, a, meta, where, base):
        return self._clamp(a["self"], None, a.get("max"), self._out(meta)[1], where)

    def op_hardtanh(self, a, meta, where, base):
        return self._clamp(a["self"], a["min_val"], a["max_val"], self._out(meta)[1], where)

    def op_relu6(self, a, meta, where, base):
        return self._clamp(a["self"], 0.0, 6.0, self._out(meta)[1], where)

    def op_where(self, a, meta, where, base):
        return pointwise("where", [a["condition"], a["self"], a["other"]], self._out(meta)[1], where)

    def op_masked_fill(self, a, meta, where, base):
        dtype = self._out(meta)[1]
        value = a["value"]
        if isinstance(value, Val):
            value = pointwise("cast", [value], dtype, where)
        else:
            value = ConstVal(value, (), dtype, where)
        return pointwise("where", [a["mask"], value, a["self"]], dtype, where)

    def _outer(self, x, y, meta, where, base):
        """A matrix product over an inner dimension of 1 is an outer product, x[..., m, 1] *
        y[..., 1, n] broadcast: one product an element, rounded once at the output dtype, as eager's
        (the frequencies of every rotary embedding: inv_freq @ positions)."""
        if not isinstance(x, Val) or not isinstance(y, Val) or len(x.shape) < 2 or len(y.shape) < 2:
            raise Unsupported(f"{where}: {base} of non-matrix operands")
        if x.shape[-1] != 1 or y.shape[-2] != 1:
            raise Unsupported(f"{where}: {base} over an inner dimension of {x.shape[-1]} (a matrix product; only an "
                              "inner dimension of 1, an outer product, is pointwise)")
        return pointwise("mul", [x, y], self._out(meta)[1], where)

    def op_mm(self, a, meta, where, base):
        return self._outer(a["self"], a["mat2"], meta, where, base)

    def op_bmm(self, a, meta, where, base):
        return self._outer(a["self"], a["mat2"], meta, where, base)

    def op_addcmul(self, a, meta, where, base):
        dtype = self._out(meta)[1]
        prod = pointwise("mul", [a["tensor1"], a["tensor2"]], "float32", where)
        if a.get("value", 1) != 1:
            prod = pointwise("mul", [prod, a["value"]], "float32", where)
        return fin("add", [pointwise("cast", [a["self"]], "float32", where), prod], dtype, where)

    def op_addcdiv(self, a, meta, where, base):
        dtype = self._out(meta)[1]
        q = pointwise("div", [a["tensor1"], a["tensor2"]], "float32", where)
        if a.get("value", 1) != 1:
            q = pointwise("mul", [q, a["value"]], "float32", where)
        return fin("add", [pointwise("cast", [a["self"]], "float32", where), q], dtype, where)

    def op_logical_not(self, a, meta, where, base):
        return pointwise("logical_not", [a["self"]], "bool", where)

    def op_bitwise_not(self, a, meta, where, base):
        if a["self"].dtype != "bool":
            raise Unsupported(f"{where}: bitwise_not of an integer tensor")
        return pointwise("logical_not", [a["self"]], "bool", where)

    def _bitwise(self, a, meta, where, op):
        if self._out(meta)[1] != "bool":
            raise Unsupported(f"{where}: a bitwise op on integers")
        return pointwise(op, [a["self"], a["other"]], "bool", where)

    def op_bitwise_and(self, a, meta, where, base):
        return self._bitwise(a, meta, where, "logical_and")

    def op_bitwise_or(self, a, meta, where, base):
        return self._bitwise(a, meta, where, "logical_or")

    def op_isnan(self, a, meta, where, base):
        return pointwise("isnan", [a["self"]], "bool", where)

    def op_isinf(self, a, meta, where, base):
        return pointwise("isinf", [a["self"]], "bool", where)

    # ---- copies and casts ------------------------------------------------------------------------
    def _copy(self, x, meta, where):
        return pointwise("cast", [x], self._out(meta)[1], where, attr=EXPLICIT)

    def op__to_copy(self, a, meta, where, base):
        return self._copy(a["self"], meta, where)

    def op_clone(self, a, meta, where, base):
        return self._copy(a["self"], meta, where)

    def op_lift_fresh_copy(self, a, meta, where, base):
        return self._copy(a["self"], meta, where)

    def op_contiguous(self, a, meta, where, base):
        return self._copy(a["self"], meta, where)

    def op_copy(self, a, meta, where, base):
        shape, dtype = self._out(meta)
        src = a["src"]
        if list(src.shape) != shape:
            src = expand(src, shape, where)
        return pointwise("cast", [src], dtype, where, attr=EXPLICIT)

    def op_type_as(self, a, meta, where, base):
        return self._copy(a["self"], meta, where)

    # ---- constants -------------------------------------------------------------------------------
    def _const(self, value, meta, where):
        shape, dtype = self._out(meta)
        return ConstVal(value, shape, dtype, where)

    def op_full(self, a, meta, where, base):
        return self._const(a["fill_value"], meta, where)

    def op_full_like(self, a, meta, where, base):
        return self._const(a["fill_value"], meta, where)

    def op_zeros_like(self, a, meta, where, base):
        return self._const(0, meta, where)

    def op_ones_like(self, a, meta, where, base):
        return self._const(1, meta, where)

    def op_zeros(self, a, meta, where, base):
        return self._const(0, meta, where)

    def op_ones(self, a, meta, where, base):
        return self._const(1, meta, where)

    def op_scalar_tensor(self, a, meta, where, base):
        return self._const(a["s"], meta, where)

    def op_fill(self, a, meta, where, base):
        if isinstance(a.get("value"), Val):
            shape, dtype = self._out(meta)
            return expand(pointwise("cast", [a["value"]], dtype, where), shape, where)
        return self._const(a["value"], meta, where)

    def op_arange(self, a, meta, where, base):
        shape, dtype = self._out(meta)
        start = a.get("start", 0)
        step = a.get("step", 1) or 1
        if not (isinstance(start, int) and isinstance(step, int)) or step < 1:
            raise Unsupported(f"{where}: arange with non-integer or negative steps")
        return IotaVal(start, step, shape[0], dtype, where)

    def op_triu(self, a, meta, where, base):
        return TriVal(a["self"], int(a.get("diagonal") or 0), True, where)

    def op_tril(self, a, meta, where, base):
        return TriVal(a["self"], int(a.get("diagonal") or 0), False, where)

    # ---- views -----------------------------------------------------------------------------------
    def op_view(self, a, meta, where, base):
        if _dtype_arg(a.get("dtype")) is not None:
            raise Unsupported(f"{where}: a view as another dtype")
        return reshape(a["self"], a["size"], where)

    def op__unsafe_view(self, a, meta, where, base):
        return reshape(a["self"], a["size"], where)

    def op_reshape(self, a, meta, where, base):
        return reshape(a["self"], a["shape"], where)

    def op__reshape_alias(self, a, meta, where, base):
        if list(a["stride"]) != contiguous_strides(a["size"]):
            raise Unsupported(f"{where}: a strided alias")
        return reshape(a["self"], a["size"], where)

    def op_expand(self, a, meta, where, base):
        return expand(a["self"], list(a["size"]), where)

    def op_permute(self, a, meta, where, base):
        return permute(a["self"], list(a["dims"]), where)

    def op_transpose(self, a, meta, where, base):
        x = a["self"]
        nd = len(x.shape)
        d0, d1 = _dim(a["dim0"], nd), _dim(a["dim1"], nd)
        perm = list(range(nd))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return permute(x, perm, where)

    def op_t(self, a, meta, where, base):
        x = a["self"]
        return permute(x, [1, 0], where) if len(x.shape) == 2 else x

    def op_unsqueeze(self, a, meta, where, base):
        return unsqueeze(a["self"], a["dim"], where)

    def op_squeeze(self, a, meta, where, base):
        dims = a.get("dim")
        if isinstance(dims, int):
            dims = [dims]
        return squeeze(a["self"], dims, where)

    def op_slice(self, a, meta, where, base):
        return slice_(a["self"], a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1), where)

    def op_narrow(self, a, meta, where, base):
        start = a["start"]
        return slice_(a["self"], a["dim"], start, start + a["length"], 1, where)

    def op_select(self, a, meta, where, base):
        return select(a["self"], a["dim"], a["index"], where)

    def op_split(self, a, meta, where, base):
        x = a["self"]
        d = _dim(a.get("dim", 0), len(x.shape))
        size = a["split_size"]
        n = x.shape[d]
        return [slice_(x, d, s, min(s + size, n), 1, where) for s in range(0, n, size)] or [x]

    def op_split_with_sizes(self, a, meta, where, base):
        x = a["self"]
        d = _dim(a.get("dim", 0), len(x.shape))
        out, s = [], 0
        for size in a["split_sizes"]:
            out.append(slice_(x, d, s, s + size, 1, where))
            s += size
        return out

    def op_unbind(self, a, meta, where, base):
        x = a["self"]
        d = _dim(a.get("dim", 0), len(x.shape))
        return [select(x, d, k, where) for k in range(x.shape[d])]

    def op_cat(self, a, meta, where, base):
        shape, dtype = self._out(meta)
        parts = [t for t in a["tensors"] if isinstance(t, Val) and not (len(t.shape) == 1 and t.shape[0] == 0)]
        if not parts:
            raise Unsupported(f"{where}: cat of nothing")
        d = _dim(a.get("dim", 0), len(parts[0].shape))
        if len(parts) == 1:
            return pointwise("cast", [parts[0]], dtype, where)
        return CatVal(parts, d, dtype, shape, where)

    def __getattr__(self, name: str):
        if name.startswith("op_") and name[3:] in IDENTITY_VIEWS:
            return lambda a, meta, where, base: a["self"]
        raise AttributeError(name)

    # ---- reductions ------------------------------------------------------------------------------
    def _red(self, kind_: str, x: Val, dims, keepdim, where: str) -> RedVal:
        if isinstance(dims, int):
            dims = [dims]
        r = reduce_(kind_, x, dims, bool(keepdim), where)
        self.reductions.append(r)
        return r

    def _count(self, x: Val, dims) -> int:
        nd = len(x.shape)
        if isinstance(dims, int):
            dims = [dims]
        ds = {_dim(d, nd) for d in dims} if dims else set(range(nd))
        return numel([x.shape[d] for d in ds])

    def _src(self, x: Val, dtype_arg, where: str) -> Val:
        dt = _dtype_arg(dtype_arg)
        if dt is not None and dt != x.dtype:
            return pointwise("cast", [x], dt, where)
        return x

    def op_sum(self, a, meta, where, base):
        x = self._src(a["self"], a.get("dtype"), where)
        return pointwise("cast", [self._red("sum", x, a.get("dim"), a.get("keepdim"), where)], self._out(meta)[1], where)

    def op_mean(self, a, meta, where, base):
        x = self._src(a["self"], a.get("dtype"), where)
        s = self._red("sum", x, a.get("dim"), a.get("keepdim"), where)
        return fin("div", [s, float(self._count(x, a.get("dim")))], self._out(meta)[1], where)

    def _minmax(self, a, meta, where, kind_):
        return pointwise("cast", [self._red(kind_, a["self"], a.get("dim"), a.get("keepdim"), where)],
                         self._out(meta)[1], where)

    def op_amax(self, a, meta, where, base):
        return self._minmax(a, meta, where, "amax")

    def op_amin(self, a, meta, where, base):
        return self._minmax(a, meta, where, "amin")

    def op_max(self, a, meta, where, base):
        if "dim" in a or "other" in a:
            if "other" in a:
                return pointwise("maximum", [a["self"], a["other"]], self._out(meta)[1], where)
            raise Unsupported(f"{where}: max over a dim returns indices")
        return self._minmax({**a, "dim": None, "keepdim": False}, meta, where, "amax")

    def op_min(self, a, meta, where, base):
        if "dim" in a or "other" in a:
            if "other" in a:
                return pointwise("minimum", [a["self"], a["other"]], self._out(meta)[1], where)
            raise Unsupported(f"{where}: min over a dim returns indices")
        return self._minmax({**a, "dim": None, "keepdim": False}, meta, where, "amin")

    def _var(self, x: Val, dims, correction, keepdim, where: str) -> tuple[Val, Val]:
        """(var, mean) in fp32: the two-step variance (the mean, then the squared deviations)."""
        n = self._count(x, dims)
        x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
        mean_k = pointwise("div", [self._red("sum", x32, dims, True, where), float(n)], "float32", where)
        dev = pointwise("sub", [x32, mean_k], "float32", where)
        ss = self._red("sum", pointwise("square", [dev], "float32", where), dims, keepdim, where)
        corr = 1.0 if correction is None else float(correction)
        var = pointwise("div", [ss, max(float(n) - corr, 0.0)], "float32", where)
        mean = pointwise("div", [self._red("sum", x32, dims, keepdim, where), float(n)], "float32", where)
        return var, mean

    def op_var(self, a, meta, where, base):
        corr = a.get("correction")
        if "unbiased" in a and a.get("unbiased") is not None:
            corr = 1 if a["unbiased"] else 0
        var, _ = self._var(a["self"], a.get("dim"), corr, a.get("keepdim"), where)
        return pointwise("cast", [var], self._out(meta)[1], where)

    def op_std(self, a, meta, where, base):
        corr = a.get("correction")
        if "unbiased" in a and a.get("unbiased") is not None:
            corr = 1 if a["unbiased"] else 0
        var, _ = self._var(a["self"], a.get("dim"), corr, a.get("keepdim"), where)
        return fin("sqrt", [var], self._out(meta)[1], where)

    def op_var_mean(self, a, meta, where, base):
        var, mean = self._var(a["self"], a.get("dim"), a.get("correction"), a.get("keepdim"), where)
        return [pointwise("cast", [var], self._out(meta, 0)[1], where), pointwise("cast", [mean], self._out(meta, 1)[1], where)]

    def op_std_mean(self, a, meta, where, base):
        var, mean = self._var(a["self"], a.get("dim"), a.get("correction"), a.get("keepdim"), where)
        return [fin("sqrt", [var], self._out(meta, 0)[1], where), pointwise("cast", [mean], self._out(meta, 1)[1], where)]

    def op_linalg_vector_norm(self, a, meta, where, base):
        x = self._src(a["self"], a.get("dtype"), where)
        order = a.get("ord", 2)
        dtype = self._out(meta)[1]
        absx = pointwise("abs", [x], "float32", where)
        if order == 2:
            return fin("sqrt", [self._red("sum", pointwise("square", [x], "float32", where), a.get("dim"),
                                          a.get("keepdim"), where)], dtype, where)
        if order == 1:
            return pointwise("cast", [self._red("sum", absx, a.get("dim"), a.get("keepdim"), where)], dtype, where)
        if order == math.inf:
            return pointwise("cast", [self._red("amax", absx, a.get("dim"), a.get("keepdim"), where)], dtype, where)
        raise Unsupported(f"{where}: a vector norm of order {order}")

    def op_logsumexp(self, a, meta, where, base):
        x = a["self"]
        x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
        m = self._red("amax", x32, a.get("dim"), True, where)
        # eager: a row whose max is +-inf uses 0 as its shift
        shift = pointwise("where", [pointwise("isinf", [m], "bool", where), 0.0, m], "float32", where)
        e = pointwise("exp", [pointwise("sub", [x32, shift], "float32", where)], "float32", where)
        s = self._red("sum", e, a.get("dim"), True, where)
        out = pointwise("add", [pointwise("log", [s], "float32", where), shift], "float32", where)
        if not a.get("keepdim"):
            out = squeeze(out, list(a.get("dim") or []), where)
        return pointwise("cast", [out], self._out(meta)[1], where)

    def _softmax(self, x: Val, dim: int, dtype: str, where: str, log: bool) -> Val:
        nd = len(x.shape)
        if nd and _dim(dim, nd) != nd - 1:
            raise Unsupported(f"{where}: softmax over dim {dim}, not the last")
        x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
        m = self._red("amax", x32, [dim], True, where)
        d = pointwise("sub", [x32, m], "float32", where)
        e = pointwise("exp", [d], "float32", where)
        s = self._red("sum", e, [dim], True, where)
        if log:
            return fin("sub", [d, pointwise("log", [s], "float32", where)], dtype, where)
        return fin("div", [e, s], dtype, where)

    def op__softmax(self, a, meta, where, base):
        return self._softmax(a["self"], a["dim"], self._out(meta)[1], where, False)

    def op__log_softmax(self, a, meta, where, base):
        return self._softmax(a["self"], a["dim"], self._out(meta)[1], where, True)

    def op__safe_softmax(self, a, meta, where, base):
        raise Unsupported(f"{where}: _safe_softmax (its fully masked rows are zeros)")

    def op_native_layer_norm(self, a, meta, where, base):
        x = a["input"]
        ns = list(a["normalized_shape"])
        dims = list(range(len(x.shape) - len(ns), len(x.shape)))
        var, mean = self._var(x, dims, 0, True, where)
        rstd = pointwise("rsqrt", [pointwise("add", [var, float(a["eps"])], "float32", where)], "float32", where)
        x32 = pointwise("cast", [x], "float32", where)
        y = pointwise("mul", [pointwise("sub", [x32, mean], "float32", where), rstd], "float32", where)
        if isinstance(a.get("weight"), Val):
            y = pointwise("mul", [y, a["weight"]], "float32", where)
        if isinstance(a.get("bias"), Val):
            y = pointwise("add", [y, a["bias"]], "float32", where)
        shape_y, dt_y = self._out(meta, 0)
        out = [pointwise("cast", [y], dt_y, where)]
        for k, v in ((1, mean), (2, rstd)):
            shape_k, dt_k = self._out(meta, k)
            out.append(pointwise("cast", [reshape(v, shape_k, where)], dt_k, where))
        return out

    def op_native_group_norm(self, a, meta, where, base):
        x = a["input"]
        n, c, hw, g = int(a["N"]), int(a["C"]), int(a["HxW"]), int(a["group"])
        if c % g or numel(x.shape) != n * c * hw:
            raise Unsupported(f"{where}: groups that do not divide the channels")
        xg = reshape(x, (n, g, (c // g) * hw), where)
        var, mean = self._var(xg, [2], 0, True, where)
        rstd = pointwise("rsqrt", [pointwise("add", [var, float(a["eps"])], "float32", where)], "float32", where)
        y = pointwise("mul", [pointwise("sub", [pointwise("cast", [xg], "float32", where), mean], "float32", where), rstd],
                      "float32", where)
        y = reshape(y, (n, c, hw), where)
        if isinstance(a.get("weight"), Val):
            y = pointwise("mul", [y, reshape(a["weight"], (c, 1), where)], "float32", where)
        if isinstance(a.get("bias"), Val):
            y = pointwise("add", [y, reshape(a["bias"], (c, 1), where)], "float32", where)
        shape_y, dt_y = self._out(meta, 0)
        out = [pointwise("cast", [reshape(y, shape_y, where)], dt_y, where)]
        for k, v in ((1, mean), (2, rstd)):
            shape_k, dt_k = self._out(meta, k)
            out.append(pointwise("cast", [reshape(v, shape_k, where)], dt_k, where))
        return out

    def _bn_inference(self, x, w, b, rm, rv, eps, meta, where):
        nd = len(x.shape)
        if nd < 2:
            raise Unsupported(f"{where}: a batch norm of a {nd}-d tensor")
        c = x.shape[1]
        shape_c = (c,) + (1,) * (nd - 2)
        x32 = pointwise("cast", [x], "float32", where)
        inv = pointwise("rsqrt", [pointwise("add", [reshape(rv, shape_c, where), float(eps)], "float32", where)],
                        "float32", where)
        y = pointwise("mul", [pointwise("sub", [x32, reshape(rm, shape_c, where)], "float32", where), inv], "float32", where)
        if isinstance(w, Val):
            y = pointwise("mul", [y, reshape(w, shape_c, where)], "float32", where)
        if isinstance(b, Val):
            y = pointwise("add", [y, reshape(b, shape_c, where)], "float32", where)
        out: list[Val | None] = [pointwise("cast", [y], self._out(meta, 0)[1], where)]
        for k in range(1, len(meta)):
            shape_k, dt_k = self._out(meta, k)
            if numel(shape_k) != 0:
                raise Unsupported(f"{where}: a batch norm that returns its statistics")
            out.append(ConstVal(0, shape_k, dt_k, where))
        return out

    def op__native_batch_norm_legit_no_training(self, a, meta, where, base):
        return self._bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                                  a["eps"], meta, where)

    def op_native_batch_norm(self, a, meta, where, base):
        if a.get("training"):
            raise Unsupported(f"{where}: a batch norm in training mode (statistics over the batch)")
        return self._bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                                  a["eps"], meta, where)

    def op__native_batch_norm_legit(self, a, meta, where, base):
        if a.get("training"):
            raise Unsupported(f"{where}: a batch norm in training mode (statistics over the batch)")
        return self._bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                                  a["eps"], meta, where)


# ---- the whole card ----------------------------------------------------------------------------
def _reachable(outs: list[Val]) -> list[Val]:
    seen: dict[int, Val] = {}
    stack = list(outs)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen[id(v)] = v
        stack.extend(v.deps())
    return list(seen.values())


def lower(card: Card) -> tuple[list[Val], list[RedVal]]:
    """The card's outputs as values, and the reductions they depend on (program order)."""
    program = card.program or {}
    nodes = program.get("nodes") or []
    if not nodes:
        raise Unsupported("the program has no nodes")
    for s in list(card.inputs) + list(card.outputs):
        if s.dtype not in FLOATS + INTS + ("bool",):
            raise Unsupported(f"a {s.dtype} tensor (the generator computes fp32, fp16, bf16, ints and bools)")
    ctx = Ctx(card)
    low = Lowering(ctx)

    for i, node in enumerate(nodes):
        for j, v in enumerate(low.handle(i, node)):
            if v is not None:
                ctx.env[(i, j)] = v
        if _is_view_node(node):
            ctx.views.add(i)
            first = node.get("args", [None])[0]
            if isinstance(first, dict) and "$in" in first:
                ctx.viewed.add(("in", first["$in"]))
            elif isinstance(first, dict) and "$node" in first:
                ctx.viewed.add(("node", first["$node"]))
    out_refs = program.get("outputs") or []
    if len(out_refs) != len(card.outputs):
        raise Unsupported(f"the program has {len(out_refs)} outputs and the card {len(card.outputs)}")
    outs: list[Val] = [ctx.ref(r) for r in out_refs]
    for k, (v, spec) in enumerate(zip(outs, card.outputs)):
        if list(v.shape) != list(spec.shape):
            raise Unsupported(f"output {k}: computes as {list(v.shape)}, the card has {spec.shape}")
    reach = {id(v) for v in _reachable(outs)}
    return outs, [r for r in low.reductions if id(r) in reach]


VIEW_OPS = {"view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute", "transpose", "t", "unsqueeze",
            "squeeze", "slice", "narrow", "select", "split", "split_with_sizes", "unbind", "alias", "detach",
            "lift_fresh", "view_as", "as_strided"}


def _is_view_node(node: dict) -> bool:
    parts = node["op"].split(".")
    return len(parts) > 1 and parts[1] in VIEW_OPS


def _linear_in_c(e: Index) -> bool:
    _, dep = e.split("c")
    return not dep.terms or (len(dep.terms) == 1 and dep.terms[0][1] == _c_atom())


def _c_atom():
    from .index import Atom

    return Atom("c")


ORDER_FREE = ("sum", "amax", "amin")
"""Reductions whose result does not depend on the order the columns come in (sums up to rounding)."""


def column_order(kern: Kernel, space: Space) -> Index | None:
    """The logical column as a function of the loop variable c such that consecutive c walk the
    largest input in its memory order, or None where they already do (or its offset is not a
    mixed radix of c). A group norm over a channels-last tensor reads a row (a group: 16 channels
    at each of 16384 positions) with a stride of 512 elements between logical columns: each
    2-byte load then costs a 32-byte sector. Only for kernels with reductions, every one of them
    order-free (sum, amax, amin): the loops visit the same columns in another order, and every
    load, output and reduction follows the same map."""
    loads = [nd for nd in kern.loads() if nd.varying]
    if not loads or not kern.reductions or any(r.kind not in ORDER_FREE for r in kern.reductions):
        return None
    size = {leaf.index: numel(leaf.shape) * ITEMSIZE[leaf.dtype] for leaf in kern.leaves}
    main = max(loads, key=lambda nd: size.get(nd.attr[0], 0))
    _, dep = main.attr[1].split("c")
    digits = []
    for coef, a in dep.terms:
        if not isinstance(a, Atom) or a.var != "c":
            return None
        digits.append((a.div, space.size(a), abs(coef)))
    digits.sort()
    expect = 1
    for div, n, _ in digits:
        if div != expect:
            return None  # not a mixed radix of c: leave the order as it is
        expect = div * n
    if expect != space.ext["c"] or [d[2] for d in digits] == sorted(d[2] for d in digits):
        return None
    c, parts, inner = space.var("c"), [], 1
    for div, n, _ in sorted(digits, key=lambda d: d[2]):  # the smallest stride innermost
        parts.append(space.scale(space.mod(space.floordiv(c, inner), n), div))
        inner *= n
    return space.add(*parts)


def build(card: Card, outs: list[Val], rows: int, cols: int, column: Index | None = None,
          only: set[int] | None = None) -> Kernel:
    """The kernel of the card's outputs over ``rows`` x ``cols`` (those in ``only`` where given)."""
    space = Space({"r": rows, "c": cols})
    b = Builder(space, rows, cols, column)
    outputs: list[Output] = []
    for k, (v, spec) in enumerate(zip(outs, card.outputs)):
        n = numel(spec.shape)
        if n == 0 or (only is not None and k not in only):
            continue
        if n == rows * cols:
            idx = space.delinearize(b.flat, spec.shape)
            per_row = False
        elif n == rows:
            idx = space.delinearize(space.var("r"), spec.shape)
            per_row = True
        else:
            raise Unsupported(f"output {k} ({list(spec.shape)}) is neither a full row set ({rows}x{cols}) nor one "
                              "value a row")
        node = b.cast(b.pull(v, tuple(idx)), spec.dtype)
        try:
            offset = space.offset_of(idx, spec.stride)
        except IndexError_ as exc:
            raise Unsupported(f"output {k}: {exc}") from None
        if per_row and b.g.nodes[node].varying:
            raise Unsupported(f"output {k}: a value a row that varies along the row")
        outputs.append(Output(k, node, offset, spec.dtype, per_row))
    if not outputs:
        raise Unsupported("every output is empty")
    leaves = [Leaf(k, s.dtype, list(s.shape), list(s.stride)) for k, s in enumerate(card.inputs)]
    kern = Kernel(rows, cols, b.g.nodes, b.g.reductions, outputs, leaves, len(card.outputs))
    reds = ", ".join(r.kind for r in kern.reductions)
    kern.summary = (f"{rows} rows x {cols} cols, {len(kern.nodes)} nodes, "
                    + (f"{len(kern.reductions)} reductions ({reds}) in {kern.levels} phases" if kern.reductions
                       else "pointwise") + f", {len(outputs)} outputs"
                    + (", columns in the input's memory order" if column is not None else ""))
    return kern


def analyze(card: Card) -> Kernel:
    """The kernel for the card, or Unsupported with the one-line reason."""
    outs, reds = lower(card)
    if reds:
        first = reds[0]
        cols = first.cols
        rows = first.src.numel // cols
        for r in reds[1:]:
            if r.cols != cols or r.src.numel != rows * cols:
                raise Unsupported(f"{r.where}: reduces {r.src.numel // r.cols} rows of {r.cols} where {first.where} "
                                  f"reduces {rows} rows of {cols}")
        kern = build(card, outs, rows, cols)
        column = column_order(kern, Space({"r": rows, "c": cols}))
        return kern if column is None else build(card, outs, rows, cols, column)
    sizes = sorted({numel(s.shape) for s in card.outputs if numel(s.shape)}, reverse=True)
    if not sizes:
        raise Unsupported("every output is empty")
    if len(sizes) > MAX_DOMAINS:
        raise Unsupported(f"pointwise outputs of {len(sizes)} different sizes ({sizes}; at most {MAX_DOMAINS})")
    # outputs of different sizes (a rotary's q and k, fewer k heads): a kernel each size, the
    # largest first, launched one after the other
    kerns = [_pointwise(card, outs, n, {k for k, s in enumerate(card.outputs) if numel(s.shape) == n})
             for n in sizes]
    largest = kerns[0]
    if len(kerns) > 1:
        largest.more = kerns[1:]
        largest.summary += "; then " + "; then ".join(k.summary for k in kerns[1:])
    return largest


MAX_DOMAINS = 4
"""Output sizes one pointwise card may have: a kernel (and a launch) each."""


def _pointwise(card: Card, outs: list[Val], n: int, only: set[int]) -> Kernel:
    """The kernel of the outputs of ``n`` elements (``only``): the widest cut that keeps every
    access linear in c (the whole output when nothing broadcasts); else the last dimension alone."""
    shape = next(list(card.outputs[k].shape) for k in sorted(only))
    for k in range(max(len(shape), 1)):
        cols = numel(shape[k:])
        kern = build(card, outs, n // cols, cols, only=only)
        offsets = [nd.attr[1] for nd in kern.loads() if nd.varying] + [o.offset for o in kern.outputs]
        if all(_linear_in_c(e) for e in offsets):
            return kern
    return kern  # the last cut tried: the last dimension alone
