"""Lowerings of the views (view, reshape, permute, transpose, expand, unsqueeze, squeeze, slice,
select), the splits and ``cat``: index arithmetic, nothing copied (views.py)."""

from __future__ import annotations

from ..values import CatVal, Unsupported, Val, dim_index, pointwise
from ..views import contiguous_strides, dtype_arg, expand, permute, reshape, select, slice_, squeeze, unsqueeze
from .registry import IDENTITY_VIEWS, out_type, register


@register("view")
def lower_view(low, a, meta, where, base):
    if dtype_arg(a.get("dtype")) is not None:
        raise Unsupported(f"{where}: a view as another dtype")
    return reshape(a["self"], a["size"], where)


@register("_unsafe_view")
def lower__unsafe_view(low, a, meta, where, base):
    return reshape(a["self"], a["size"], where)


@register("reshape")
def lower_reshape(low, a, meta, where, base):
    return reshape(a["self"], a["shape"], where)


@register("_reshape_alias")
def lower__reshape_alias(low, a, meta, where, base):
    if list(a["stride"]) != contiguous_strides(a["size"]):
        raise Unsupported(f"{where}: a strided alias")
    return reshape(a["self"], a["size"], where)


@register("expand")
def lower_expand(low, a, meta, where, base):
    return expand(a["self"], list(a["size"]), where)


@register("permute")
def lower_permute(low, a, meta, where, base):
    return permute(a["self"], list(a["dims"]), where)


@register("transpose")
def lower_transpose(low, a, meta, where, base):
    x = a["self"]
    nd = len(x.shape)
    d0, d1 = dim_index(a["dim0"], nd), dim_index(a["dim1"], nd)
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute(x, perm, where)


@register("t")
def lower_t(low, a, meta, where, base):
    x = a["self"]
    return permute(x, [1, 0], where) if len(x.shape) == 2 else x


@register("unsqueeze")
def lower_unsqueeze(low, a, meta, where, base):
    return unsqueeze(a["self"], a["dim"], where)


@register("squeeze")
def lower_squeeze(low, a, meta, where, base):
    dims = a.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    return squeeze(a["self"], dims, where)


@register("slice")
def lower_slice(low, a, meta, where, base):
    return slice_(a["self"], a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1), where)


@register("narrow")
def lower_narrow(low, a, meta, where, base):
    start = a["start"]
    return slice_(a["self"], a["dim"], start, start + a["length"], 1, where)


@register("select")
def lower_select(low, a, meta, where, base):
    return select(a["self"], a["dim"], a["index"], where)


@register("split")
def lower_split(low, a, meta, where, base):
    x = a["self"]
    d = dim_index(a.get("dim", 0), len(x.shape))
    size = a["split_size"]
    n = x.shape[d]
    return [slice_(x, d, s, min(s + size, n), 1, where) for s in range(0, n, size)] or [x]


@register("split_with_sizes")
def lower_split_with_sizes(low, a, meta, where, base):
    x = a["self"]
    d = dim_index(a.get("dim", 0), len(x.shape))
    out, s = [], 0
    for size in a["split_sizes"]:
        out.append(slice_(x, d, s, s + size, 1, where))
        s += size
    return out


@register("unbind")
def lower_unbind(low, a, meta, where, base):
    x = a["self"]
    d = dim_index(a.get("dim", 0), len(x.shape))
    return [select(x, d, k, where) for k in range(x.shape[d])]


@register("cat")
def lower_cat(low, a, meta, where, base):
    shape, dtype = out_type(meta)
    parts = [t for t in a["tensors"] if isinstance(t, Val) and not (len(t.shape) == 1 and t.shape[0] == 0)]
    if not parts:
        raise Unsupported(f"{where}: cat of nothing")
    d = dim_index(a.get("dim", 0), len(parts[0].shape))
    if len(parts) == 1:
        return pointwise("cast", [parts[0]], dtype, where)
    return CatVal(parts, d, dtype, shape, where)


def _identity(low, a, meta, where, base):
    return a["self"]


for _name in IDENTITY_VIEWS:
    register(_name)(_identity)
