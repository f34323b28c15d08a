"""Range cards: one card for calls that differ only in dimensions that vary from call to call.

A generation's decode steps call the same ops at a KV length that grows by one at every step (and
a server's at another batch): a card per exact shape would make one card a step, none of which a
kernel could serve at the next step. A range card stands for all of them: its ``ranges`` name each
varying dimension (``"input0.dim2"``) with the sizes seen, weighted by calls. Its ``inputs``,
``outputs`` and ``program`` are those of its most weighted size.

A call belongs to a range card by its *shape class*: every dimension the card does not range over
has the card's size, every ranged one a size inside the range, and each tensor is laid out as the
card's is at that size (the same order of dimensions in memory, dense: what a growing cache's
transposed view is at every step). The guard matches calls so (``runtime/guard.py``), the
evaluator checks a candidate at sizes of the range (``checked_sizes``, ``at_sizes``).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from .cards import Card, DimRange, TensorSpec

KEY_RE = re.compile(r"^(input|output)(\d+)\.dim(\d+)$")

OUTSIDE_RANGE = "outside the card's range"
"""The reason a call of a range card's shape class at a size outside the range falls back."""


def dim_key(io: str, k: int, d: int) -> str:
    return f"{io}{k}.dim{d}"


def parse_key(key: str) -> tuple[str, int, int]:
    m = KEY_RE.match(key)
    if m is None:
        raise ValueError(f"not a range key: {key!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def input_ranges(ranges: dict[str, DimRange]) -> dict[int, dict[int, tuple[int, int]]]:
    """Per input index, its ranged dimensions' (min, max)."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for key, r in ranges.items():
        io, k, d = parse_key(key)
        if io == "input":
            out.setdefault(k, {})[d] = (r.min, r.max)
    return out


def dim_order(shape: Sequence[int], stride: Sequence[int], keep: Iterable[int] = ()) -> tuple[int, ...] | None:
    """The order in memory of a dense tensor's dimensions larger than one and those of ``keep``
    (a range card's ranged dimensions), outermost first (its strides a contiguous layout of some
    permutation of its dimensions), None where it is not dense (a slice, a broadcast). A ranged
    dimension of size one at the card's own size keeps its place by its stride: a decode step's
    one row of q, a view of [batch, rows, heads, dim] transposed to put the heads first, has the
    row stride of heads x dim, and its prefill's rows lie outside the heads in memory."""
    sized = [d for d in range(len(shape)) if shape[d] > 1]
    ones = sorted({d for d in keep if shape[d] == 1})
    # a ranged dimension of one whose stride fits no place goes where a contiguous layout puts it
    for dims in ([*sized, *ones], sized) if ones else (sized,):
        order = sorted(dims, key=lambda d: (-stride[d], d))
        acc = 1
        for d in reversed(order):
            if stride[d] != acc:
                break
            acc *= shape[d]
        else:
            return tuple(order)
    return None


def dense_strides(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """Strides of a dense layout of ``shape`` with dimensions ``order`` outermost first; a
    dimension ``order`` leaves out (of size one where the order was taken) goes where a contiguous
    layout puts it, just outside the next dimension in index order."""
    full = list(order)
    for d in range(len(shape)):
        if d not in full:
            after = [i for i, e in enumerate(full) if e > d]
            full.insert(after[0] if after else len(full), d)
    stride = [0] * len(shape)
    acc = 1
    for d in reversed(full):
        stride[d] = acc
        acc *= max(shape[d], 1)
    return stride


def same_class(a: TensorSpec, b: TensorSpec) -> bool:
    """Whether two tensors' specs can be sizes of one range card's input: same dtype, role and
    rank, and either the same strides or both dense in the same order of dimensions."""
    if a.dtype != b.dtype or a.role != b.role or len(a.shape) != len(b.shape):
        return False
    if a.stride == b.stride:
        return True
    oa, ob = dim_order(a.shape, a.stride), dim_order(b.shape, b.stride)
    if oa is None or ob is None:
        return False
    # the dims larger than one in both must be in the same order
    both = [d for d in oa if d in ob]
    return both == [d for d in ob if d in oa]


def fits(t: Any, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...], ranged: dict[int, tuple[int, int]]) -> str | None:
    """Why tensor ``t`` is not of a range card input's shape class, None where it is:
    ``OUTSIDE_RANGE`` where only a ranged size lies outside its range."""
    tshape = t.shape
    if t.dtype is not dtype:
        return f"dtype {str(t.dtype).removeprefix('torch.')}"
    if len(tshape) != len(shape):
        return f"shape {tuple(tshape)}"
    outside = False
    for d, n in enumerate(tshape):
        r = ranged.get(d)
        if r is None:
            if n != shape[d]:
                return f"shape {tuple(tshape)}"
        elif not r[0] <= n <= r[1]:
            outside = True
    if t.numel() > 1 and tuple(t.stride()) != stride:
        # the same layout class: the layout ``at_sizes`` gives the card at this size (dense, its
        # dimensions in the card's order), the strides of dimensions of size one aside
        order = dim_order(shape, stride, ranged)
        want = dense_strides(tshape, order) if order is not None else stride
        if any(n > 1 and st != w for n, st, w in zip(tshape, t.stride(), want)):
            return f"strides {tuple(t.stride())}"
    return OUTSIDE_RANGE if outside else None


def output_shape(card_shape: Sequence[int], k: int, ranges: dict[str, DimRange],
                 inputs: Sequence[Any]) -> list[int] | None:
    """Output ``k``'s shape for a call whose inputs are ``inputs`` (tensors or shapes): each ranged
    dimension the size of the input dimension it follows (``DimRange.same_as``); None where one
    follows none."""
    shape = list(card_shape)
    for d in range(len(shape)):
        r = ranges.get(dim_key("output", k, d))
        if r is None:
            continue
        if r.same_as is None:
            return None
        _, i, di = parse_key(r.same_as)
        x = inputs[i]
        shape[d] = int((x.shape if hasattr(x, "shape") else x)[di])
    return shape


def output_layout(card_shape: Sequence[int], card_stride: Sequence[int], k: int, ranges: dict[str, DimRange],
                  inputs: Sequence[Any]) -> tuple[list[int], list[int] | None] | None:
    """Output ``k``'s shape for a call of ``inputs`` (``output_shape``) and its strides, laid
    out as the card's output is (None where the card's is not dense); None where a ranged
    dimension follows no input's. What a range card's kernel allocates and what a compiled
    graph is told its custom op returns."""
    shape = output_shape(card_shape, k, ranges, inputs)
    if shape is None:
        return None
    order = dim_order(card_shape, card_stride, _ranged_dims(ranges, "output", k))
    return shape, (dense_strides(shape, order) if order is not None else None)


def _ranged_dims(ranges: dict[str, DimRange], io: str, k: int) -> list[int]:
    return [d for key in ranges for kio, kk, d in [parse_key(key)] if kio == io and kk == k]


def range_reason(card: Card) -> str | None:
    """Why no kernel can serve ``card``'s range whatever it computes, None where one can: an output
    dimension whose size follows no input's (the runtime could not size it)."""
    for key, r in card.ranges.items():
        if key.startswith("output") and r.same_as is None:
            return f"{key}'s size follows no input dimension's, so a call's output cannot be sized"
    return None


def _primes(lo: int, hi: int) -> list[int]:
    return [n for n in range(max(lo, 2), hi + 1) if all(n % p for p in range(2, int(n ** 0.5) + 1))]


def checked_sizes(r: DimRange, most: int = 6) -> list[int]:
    """The sizes of one ranged dimension a candidate is checked at: the range's ends, then an odd
    and a prime size inside it (the ones nearest its middle), at most ``most``, ascending."""
    inside = range(r.min + 1, r.max)
    mid = (r.min + r.max) / 2
    picks = [r.min, r.max]
    odd = sorted((n for n in inside if n % 2), key=lambda n: abs(n - mid))
    prime = sorted((n for n in _primes(r.min + 1, r.max - 1)), key=lambda n: abs(n - mid))
    for n in prime[:2] + odd[:2]:
        if n not in picks:
            picks.append(n)
    return sorted(set(picks[:most]))


def heaviest(r: DimRange, n: int = 1) -> list[int]:
    """The ``n`` sizes the profile weighted most (ties: the larger)."""
    return [s for s, _ in sorted(r.sizes().items(), key=lambda kv: (-kv[1], -kv[0]))[:n]]


def size_points(card: Card, per_dim: Iterable[int] | None = None) -> list[dict[str, int]]:
    """The sizes a range card's candidate is checked at, each a {input range key: size}: every
    ranged input dimension at ``checked_sizes`` while the others keep their most weighted size.
    Dimensions ranged together (the same size at every call, as a batch in several inputs) move
    together."""
    groups = _linked(card)
    points: list[dict[str, int]] = []
    for keys in groups:
        r = card.ranges[keys[0]]
        for n in checked_sizes(r):
            point = {k: heaviest(card.ranges[k])[0] for g in groups for k in g}
            for k in keys:
                point[k] = n
            if point not in points:
                points.append(point)
    return points


def heaviest_point(card: Card) -> dict[str, int]:
    """Every ranged input dimension at its most weighted size: the card's own inputs' shapes."""
    return {k: heaviest(r)[0] for k, r in card.ranges.items() if k.startswith("input")}


def _linked(card: Card) -> list[list[str]]:
    """The ranged input dimensions grouped by their sizes' weights: dimensions with the same
    sizes at the same weights vary together (one KV length in a product's two operands)."""
    groups: dict[tuple, list[str]] = {}
    for k, r in sorted(card.ranges.items()):
        if k.startswith("input"):
            groups.setdefault((r.min, r.max, tuple(sorted(r.sizes().items()))), []).append(k)
    return list(groups.values())


def at_sizes(card: Card, point: dict[str, int]) -> Card:
    """The exact-shape card of ``card``'s range at ``point`` (input range keys to sizes): inputs
    laid out as the card's are, outputs sized by ``same_as``, the program's types worked out on the
    meta device, no samples (the evaluator draws fresh inputs from the captured ones' value
    ranges)."""
    inputs = []
    for k, s in enumerate(card.inputs):
        shape = list(s.shape)
        for d in range(len(shape)):
            key = dim_key("input", k, d)
            if key in point:
                shape[d] = point[key]
        order = dim_order(s.shape, s.stride, _ranged_dims(card.ranges, "input", k))
        stride = dense_strides(shape, order) if order is not None else list(s.stride)
        inputs.append(s.model_copy(update={"shape": shape, "stride": stride}))
    outputs = []
    for k, s in enumerate(card.outputs):
        sized = output_shape(s.shape, k, card.ranges, [i.shape for i in inputs])
        if sized is None:
            raise ValueError(range_reason(card) or f"output {k} cannot be sized")
        order = dim_order(s.shape, s.stride, _ranged_dims(card.ranges, "output", k))
        stride = dense_strides(sized, order) if order is not None else list(s.stride)
        outputs.append(s.model_copy(update={"shape": sized, "stride": stride}))
    program = program_at(card.program, inputs)
    label = f"{card.op_name}({', '.join(s.short() for s in inputs if s.role in ('input', 'param')) or '-'})"
    return card.model_copy(update={
        "inputs": inputs, "outputs": outputs, "program": program, "ranges": {}, "samples": [], "label": label,
        "flags": sorted({*card.flags, "no_sample"}), "bytes": _bytes(inputs, outputs),
    })


def _bytes(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> int:
    from .kernel_abi import ITEMSIZE

    return sum(s.numel * ITEMSIZE.get(s.dtype, 4) for s in [*inputs, *outputs])


def program_at(program: dict, inputs: list[TensorSpec]) -> dict:
    """``program`` with each node's recorded output types (``out``: shape and dtype) those it has
    on inputs of these specs, worked out on the meta device."""
    import torch

    from .program import decode, flatten_outputs, resolve_op

    if not any("out" in n for n in program.get("nodes", [])):
        return program
    ins = [torch.empty_strided(s.shape, s.stride, dtype=getattr(torch, s.dtype), device="meta") for s in inputs]
    outs: list[list[Any]] = []

    def resolve(ref: dict) -> Any:
        if "$in" in ref:
            return ins[ref["$in"]]
        return outs[ref["$node"]][ref.get("out", 0)]

    nodes = []
    for node in program["nodes"]:
        func = resolve_op(node["op"])
        args = decode(node["args"], resolve, "meta")
        kwargs = decode(node.get("kwargs", {}), resolve, "meta")
        flat = flatten_outputs(func(*args, **kwargs))
        outs.append(flat)
        if "out" in node:
            node = {**node, "out": [[list(t.shape), str(t.dtype).removeprefix("torch.")]
                                    if isinstance(t, torch.Tensor) else None for t in flat]}
        nodes.append(node)
    return {**program, "nodes": nodes}
