"""A card's aten program lowered to values (values.py), node by node through the lowerings table
(lowerings/): each call bound to its schema's argument names, its outputs checked against the
types eager recorded; in-place writes through views and to viewed tensors refused. Also which
ops a chain card may link (``chains_op``, ``index_link``), asked by the profiler."""

from __future__ import annotations

from ..cards import Card
from .ir import FLOATS, INTS
from .lowerings import IDENTITY_VIEWS, LOWERINGS
from .values import LeafVal, RedVal, Unsupported, Val


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
    return base in LOWERINGS and not _is_view_op(base)


def _is_view_op(base: str) -> bool:
    return base in IDENTITY_VIEWS or base in {"view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute",
                                              "transpose", "t", "unsqueeze", "squeeze", "slice", "narrow", "select"}



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
        fn = LOWERINGS.get(base)
        if fn is None:
            raise Unsupported(f"{where}: {base} is not a pointwise op, view or reduction the generator knows")
        out = fn(self, a, meta, where, base)
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

