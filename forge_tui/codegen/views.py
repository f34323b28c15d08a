"""View algebra: reshape, permute, expand, unsqueeze, squeeze, slice and select as rewrites of
the index a value is asked at (``ViewVal``); nothing is materialised."""

from __future__ import annotations

from .index import Index
from .values import Unsupported, Val, ViewVal, dim_index, numel


def dtype_arg(x) -> str | None:
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
    perm = [dim_index(p, nd) for p in perm]
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
    d = dim_index(dim, nd)
    shape = v.shape[:d] + (1,) + v.shape[d:]
    return ViewVal(v, shape, lambda b, idx: tuple(x for k, x in enumerate(idx) if k != d), where)


def squeeze(v: Val, dims: list[int] | None, where: str) -> Val:
    nd = len(v.shape)
    drop = set(range(nd)) if dims is None else {dim_index(d, nd) for d in dims}
    drop = {d for d in drop if v.shape[d] == 1}
    shape = tuple(s for d, s in enumerate(v.shape) if d not in drop)

    def fn(b, idx):
        it = iter(idx)
        return tuple(Index() if d in drop else next(it) for d in range(nd))

    return ViewVal(v, shape, fn, where)


def slice_(v: Val, dim: int, start, end, step: int, where: str) -> Val:
    nd = len(v.shape)
    d = dim_index(dim, nd)
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
    d = dim_index(dim, nd)
    if index < 0:
        index += v.shape[d]
    shape = v.shape[:d] + v.shape[d + 1:]

    def fn(b, idx):
        return tuple(idx[:d]) + (b.space.const(index),) + tuple(idx[d:])

    return ViewVal(v, shape, fn, where)

