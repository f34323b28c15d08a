"""The generator's intermediate form: a scalar dataflow graph evaluated at one element ``(r, c)``.

A :class:`Kernel` computes, for every row ``r`` of ``rows`` and column ``c`` of ``cols``, the
nodes its outputs need. Nodes are interned (the same operation on the same operands is one node),
numbered in topological order, and typed by the dtype eager gives the value: a float node of
dtype bfloat16 holds a float rounded to bfloat16, as eager's tensor would. Each node knows whether
it varies along the row (``varying``: it depends on ``c``) and its ``level``: how many reductions
lie before it (a row-invariant node of level 1 can be computed once the first reductions of the
row are done). Reductions (sum, amax, amin over the row of a level-L float node) are the only
cross-element operations; their results are fp32 values of level L + 1.

``OPS`` holds the semantics of every scalar operation twice: as C (one template for both
backends; the helpers are in the emitters' prelude) and as a torch function, which the
interpreter (interp.py) uses to check the analysis without compiling anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .index import Index

FLOATS = ("float32", "float16", "bfloat16")
EXPLICIT = "explicit"
"""A cast node's attr when the model cast (``.to``, ``type_as``, a copy), not an op rounding its result."""
INTS = ("int64", "int32", "int16", "int8", "uint8")


def kind(dtype: str) -> str:
    """'f' (computed in fp32 and rounded to the dtype), 'i' (int64) or 'b' (bool)."""
    if dtype in FLOATS:
        return "f"
    if dtype == "bool":
        return "b"
    if dtype in INTS:
        return "i"
    raise ValueError(dtype)


@dataclass(frozen=True)
class Op:
    arity: int
    c: str
    """C expression over {0}, {1}, ... (fp32 operands), attribute values as {a0}, {a1}, ..."""
    torch: Callable[..., Any]
    """(operand tensors in fp32, *attributes) -> fp32 tensor."""
    out: str = "f"
    """'f' float result, 'b' bool result."""


def _t():
    import torch

    return torch


def _gelu(x, approx="none"):
    import torch.nn.functional as F

    return F.gelu(x, approximate=approx)


def _max(a, b):
    t = _t()
    return t.maximum(a, b)


def _min(a, b):
    t = _t()
    return t.minimum(a, b)


def _clamp(x, lo, hi):
    t = _t()
    return t.clamp(x, min=lo, max=hi)


FLOAT_OPS: dict[str, Op] = {
    "add": Op(2, "({0} + {1})", lambda a, b: a + b),
    "sub": Op(2, "({0} - {1})", lambda a, b: a - b),
    "mul": Op(2, "({0} * {1})", lambda a, b: a * b),
    "div": Op(2, "({0} / {1})", lambda a, b: a / b),
    "neg": Op(1, "(-{0})", lambda a: -a),
    "abs": Op(1, "fabsf({0})", lambda a: a.abs()),
    "exp": Op(1, "expf({0})", lambda a: a.exp()),
    "exp2": Op(1, "exp2f({0})", lambda a: a.exp2()),
    "expm1": Op(1, "expm1f({0})", lambda a: a.expm1()),
    "log": Op(1, "logf({0})", lambda a: a.log()),
    "log2": Op(1, "log2f({0})", lambda a: a.log2()),
    "log10": Op(1, "log10f({0})", lambda a: a.log10()),
    "log1p": Op(1, "log1pf({0})", lambda a: a.log1p()),
    "sqrt": Op(1, "sqrtf({0})", lambda a: a.sqrt()),
    "rsqrt": Op(1, "fg_rsqrt({0})", lambda a: a.rsqrt()),
    "reciprocal": Op(1, "(1.f / {0})", lambda a: a.reciprocal()),
    "sin": Op(1, "sinf({0})", lambda a: a.sin()),
    "cos": Op(1, "cosf({0})", lambda a: a.cos()),
    "tan": Op(1, "tanf({0})", lambda a: a.tan()),
    "tanh": Op(1, "tanhf({0})", lambda a: a.tanh()),
    "atan": Op(1, "atanf({0})", lambda a: a.atan()),
    "erf": Op(1, "erff({0})", lambda a: a.erf()),
    "sigmoid": Op(1, "fg_sigmoid({0})", lambda a: a.sigmoid()),
    "silu": Op(1, "fg_silu({0})", lambda a: _t().nn.functional.silu(a)),
    "relu": Op(1, "fg_relu({0})", lambda a: a.relu()),
    "gelu": Op(1, "fg_gelu({0})", lambda a: _gelu(a)),
    "gelu_tanh": Op(1, "fg_gelu_tanh({0})", lambda a: _gelu(a, "tanh")),
    "mish": Op(1, "fg_mish({0})", lambda a: _t().nn.functional.mish(a)),
    "hardsigmoid": Op(1, "fg_hardsigmoid({0})", lambda a: _t().nn.functional.hardsigmoid(a)),
    "hardswish": Op(1, "fg_hardswish({0})", lambda a: _t().nn.functional.hardswish(a)),
    "floor": Op(1, "floorf({0})", lambda a: a.floor()),
    "ceil": Op(1, "ceilf({0})", lambda a: a.ceil()),
    "round": Op(1, "nearbyintf({0})", lambda a: a.round()),
    "trunc": Op(1, "truncf({0})", lambda a: a.trunc()),
    "sign": Op(1, "fg_sign({0})", lambda a: a.sign()),
    "square": Op(1, "({0} * {0})", lambda a: a * a),
    "maximum": Op(2, "fg_max({0}, {1})", _max),
    "minimum": Op(2, "fg_min({0}, {1})", _min),
    "pow": Op(2, "powf({0}, {1})", lambda a, b: a.pow(b)),
    "atan2": Op(2, "atan2f({0}, {1})", lambda a, b: _t().atan2(a, b)),
    "clamp": Op(1, "fg_clamp({0}, {a0}, {a1})", lambda a, lo, hi: _clamp(a, lo, hi)),
    "softplus": Op(1, "fg_softplus({0}, {a0}, {a1})", lambda a, beta, th: _t().nn.functional.softplus(a, beta, th)),
    "leaky_relu": Op(1, "fg_leaky_relu({0}, {a0})", lambda a, s: _t().nn.functional.leaky_relu(a, s)),
    "elu": Op(1, "fg_elu({0}, {a0}, {a1}, {a2})",
              lambda a, al, sc, isc: _t().ops.aten.elu(a, al, sc, isc)),
    # comparisons and predicates (bool results, operands compared as floats)
    "eq": Op(2, "({0} == {1})", lambda a, b: a == b, "b"),
    "ne": Op(2, "({0} != {1})", lambda a, b: a != b, "b"),
    "lt": Op(2, "({0} < {1})", lambda a, b: a < b, "b"),
    "le": Op(2, "({0} <= {1})", lambda a, b: a <= b, "b"),
    "gt": Op(2, "({0} > {1})", lambda a, b: a > b, "b"),
    "ge": Op(2, "({0} >= {1})", lambda a, b: a >= b, "b"),
    "isnan": Op(1, "({0} != {0})", lambda a: a.isnan(), "b"),
    "isinf": Op(1, "(fabsf({0}) == INFINITY)", lambda a: a.isinf(), "b"),
}
INT_OPS = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "neg": "(-{0})",
           "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
           "gt": "({0} > {1})", "ge": "({0} >= {1})", "abs": "({0} < 0 ? -{0} : {0})",
           "maximum": "({0} > {1} ? {0} : {1})", "minimum": "({0} < {1} ? {0} : {1})"}
BOOL_OPS = {"logical_not": "(!{0})", "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
            "logical_xor": "({0} != {1})", "eq": "({0} == {1})", "ne": "({0} != {1})"}
REDUCTIONS = ("sum", "amax", "amin")


@dataclass
class Node:
    id: int
    op: str
    args: tuple[int, ...]
    attr: Any
    dtype: str
    varying: bool
    level: int

    @property
    def kind(self) -> str:
        return kind(self.dtype)


@dataclass
class Reduction:
    kind: str  # sum, amax, amin
    body: int
    level: int


@dataclass
class Output:
    index: int
    """Which output of the card."""
    node: int
    offset: Index
    """Where the element of (r, c) goes (per-row outputs: of (r, 0))."""
    dtype: str
    per_row: bool


@dataclass
class Leaf:
    index: int
    dtype: str
    shape: list[int]
    stride: list[int]


@dataclass
class Kernel:
    rows: int
    cols: int
    nodes: list[Node]
    reductions: list[Reduction]
    outputs: list[Output]
    leaves: list[Leaf]
    n_outputs: int
    """The card's output count (zero-size outputs have no Output entry)."""
    summary: str = ""
    memo: dict = field(default_factory=dict, repr=False)
    """Derived facts the emitters and the family ask for repeatedly."""
    more: list["Kernel"] = field(default_factory=list)
    """Pointwise programs whose outputs differ in size (a rotary's q and k with fewer k heads): the
    other outputs' kernels, each over its own rows and columns, launched after this one."""

    @property
    def domains(self) -> list["Kernel"]:
        """This kernel and the others of its program (see ``more``)."""
        return [self, *self.more]

    @property
    def levels(self) -> int:
        """Reduction phases before the output phase."""
        return 1 + max((r.level for r in self.reductions), default=-1)

    def needed(self, roots: list[int]) -> list[int]:
        """Node ids the roots depend on (themselves included), in topological order."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(self.nodes[n].args)
        return sorted(seen)

    def loads(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "load"]


class Graph:
    """Interned nodes under construction."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.table: dict[tuple, int] = {}
        self.reductions: list[Reduction] = []
        self.red_table: dict[tuple[str, int], int] = {}

    def add(self, op: str, args: tuple[int, ...], attr: Any, dtype: str, varying: bool | None = None) -> int:
        key = (op, args, _hashable(attr), dtype)
        hit = self.table.get(key)
        if hit is not None:
            return hit
        if op == "red":
            level = self.reductions[attr].level + 1
            vary = False
        else:
            level = max((self.nodes[a].level for a in args), default=0)
            vary = any(self.nodes[a].varying for a in args) if varying is None else varying
        node = Node(len(self.nodes), op, args, attr, dtype, vary, level)
        self.nodes.append(node)
        self.table[key] = node.id
        return node.id

    def reduction(self, kind_: str, body: int) -> int:
        """A reduction of ``body`` over the row (one per kind and body); returns the node holding its
        result."""
        k = self.red_table.get((kind_, body))
        if k is None:
            self.reductions.append(Reduction(kind_, body, self.nodes[body].level))
            k = self.red_table[(kind_, body)] = len(self.reductions) - 1
        return self.add("red", (), k, "float32")


def _hashable(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_hashable(v) for v in x)
    if isinstance(x, float) and math.isnan(x):
        return ("nan",)
    return x


def c_float(v: float) -> str:
    """A C expression for the fp32 value eager uses for the Python number ``v`` (double -> float,
    round to nearest)."""
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if v == 0:
        return "-0.f" if math.copysign(1.0, v) < 0 else "0.f"
    if v == int(v) and abs(v) < 1 << 24:
        return f"{int(v)}.f" if v > 0 else f"({int(v)}.f)"
    return f"(float){float(v).hex()}"
