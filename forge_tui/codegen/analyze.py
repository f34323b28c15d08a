"""From a card's aten program to a :class:`~.ir.Kernel`, or the one-line reason it cannot be.

The program is lowered to lazy values (lower.py, values.py): something that, asked for its
element at an index (one :class:`~.index.Index` per dimension), adds the nodes computing it to the
graph (builder.py). Pointwise ops ask their operands at the broadcast index; views and slices only
rewrite the index; reductions over the last dimensions become row reductions. Nothing is
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

from ..cards import Card
from ..kernel_abi import ITEMSIZE
from .builder import Builder
from .index import Atom, Index, IndexError_, Space
from .ir import Kernel, Leaf, Output
from .lower import lower
from .values import Unsupported, Val, numel

__all__ = ["Unsupported", "analyze", "build", "column_order"]


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
