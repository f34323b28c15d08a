"""Lowerings of the reductions over the last dimensions (sum, mean, amax, amin, max, min, var,
std, vector norms, logsumexp, softmax), written as their fp32 steps: each reduction a row
reduction of the kernel (``RedVal``), recorded on the lowering's list in program order."""

from __future__ import annotations

import math

from ..values import RedVal, Unsupported, Val, dim_index, fin, numel, pointwise, reduce_
from ..views import dtype_arg, squeeze
from .registry import out_type, register


def _red(low, kind_: str, x: Val, dims, keepdim, where: str) -> RedVal:
    if isinstance(dims, int):
        dims = [dims]
    r = reduce_(kind_, x, dims, bool(keepdim), where)
    low.reductions.append(r)
    return r


def _count(x: Val, dims) -> int:
    nd = len(x.shape)
    if isinstance(dims, int):
        dims = [dims]
    ds = {dim_index(d, nd) for d in dims} if dims else set(range(nd))
    return numel([x.shape[d] for d in ds])


def _src(x: Val, dtype, where: str) -> Val:
    dt = dtype_arg(dtype)
    if dt is not None and dt != x.dtype:
        return pointwise("cast", [x], dt, where)
    return x


@register("sum")
def lower_sum(low, a, meta, where, base):
    x = _src(a["self"], a.get("dtype"), where)
    return pointwise("cast", [_red(low, "sum", x, a.get("dim"), a.get("keepdim"), where)], out_type(meta)[1], where)


@register("mean")
def lower_mean(low, a, meta, where, base):
    x = _src(a["self"], a.get("dtype"), where)
    s = _red(low, "sum", x, a.get("dim"), a.get("keepdim"), where)
    return fin("div", [s, float(_count(x, a.get("dim")))], out_type(meta)[1], where)


def _minmax(low, a, meta, where, kind_):
    return pointwise("cast", [_red(low, kind_, a["self"], a.get("dim"), a.get("keepdim"), where)],
                     out_type(meta)[1], where)


@register("amax")
def lower_amax(low, a, meta, where, base):
    return _minmax(low, a, meta, where, "amax")


@register("amin")
def lower_amin(low, a, meta, where, base):
    return _minmax(low, a, meta, where, "amin")


@register("max")
def lower_max(low, a, meta, where, base):
    if "dim" in a or "other" in a:
        if "other" in a:
            return pointwise("maximum", [a["self"], a["other"]], out_type(meta)[1], where)
        raise Unsupported(f"{where}: max over a dim returns indices")
    return _minmax(low, {**a, "dim": None, "keepdim": False}, meta, where, "amax")


@register("min")
def lower_min(low, a, meta, where, base):
    if "dim" in a or "other" in a:
        if "other" in a:
            return pointwise("minimum", [a["self"], a["other"]], out_type(meta)[1], where)
        raise Unsupported(f"{where}: min over a dim returns indices")
    return _minmax(low, {**a, "dim": None, "keepdim": False}, meta, where, "amin")


def var_and_mean(low, x: Val, dims, correction, keepdim, where: str) -> tuple[Val, Val]:
    """(var, mean) in fp32: the two-step variance (the mean, then the squared deviations)."""
    n = _count(x, dims)
    x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
    mean_k = pointwise("div", [_red(low, "sum", x32, dims, True, where), float(n)], "float32", where)
    dev = pointwise("sub", [x32, mean_k], "float32", where)
    ss = _red(low, "sum", pointwise("square", [dev], "float32", where), dims, keepdim, where)
    corr = 1.0 if correction is None else float(correction)
    var = pointwise("div", [ss, max(float(n) - corr, 0.0)], "float32", where)
    mean = pointwise("div", [_red(low, "sum", x32, dims, keepdim, where), float(n)], "float32", where)
    return var, mean


@register("var")
def lower_var(low, a, meta, where, base):
    corr = a.get("correction")
    if "unbiased" in a and a.get("unbiased") is not None:
        corr = 1 if a["unbiased"] else 0
    var, _ = var_and_mean(low, a["self"], a.get("dim"), corr, a.get("keepdim"), where)
    return pointwise("cast", [var], out_type(meta)[1], where)


@register("std")
def lower_std(low, a, meta, where, base):
    corr = a.get("correction")
    if "unbiased" in a and a.get("unbiased") is not None:
        corr = 1 if a["unbiased"] else 0
    var, _ = var_and_mean(low, a["self"], a.get("dim"), corr, a.get("keepdim"), where)
    return fin("sqrt", [var], out_type(meta)[1], where)


@register("var_mean")
def lower_var_mean(low, a, meta, where, base):
    var, mean = var_and_mean(low, a["self"], a.get("dim"), a.get("correction"), a.get("keepdim"), where)
    return [pointwise("cast", [var], out_type(meta, 0)[1], where), pointwise("cast", [mean], out_type(meta, 1)[1], where)]


@register("std_mean")
def lower_std_mean(low, a, meta, where, base):
    var, mean = var_and_mean(low, a["self"], a.get("dim"), a.get("correction"), a.get("keepdim"), where)
    return [fin("sqrt", [var], out_type(meta, 0)[1], where), pointwise("cast", [mean], out_type(meta, 1)[1], where)]


@register("linalg_vector_norm")
def lower_linalg_vector_norm(low, a, meta, where, base):
    x = _src(a["self"], a.get("dtype"), where)
    order = a.get("ord", 2)
    dtype = out_type(meta)[1]
    absx = pointwise("abs", [x], "float32", where)
    if order == 2:
        return fin("sqrt", [_red(low, "sum", pointwise("square", [x], "float32", where), a.get("dim"),
                                      a.get("keepdim"), where)], dtype, where)
    if order == 1:
        return pointwise("cast", [_red(low, "sum", absx, a.get("dim"), a.get("keepdim"), where)], dtype, where)
    if order == math.inf:
        return pointwise("cast", [_red(low, "amax", absx, a.get("dim"), a.get("keepdim"), where)], dtype, where)
    raise Unsupported(f"{where}: a vector norm of order {order}")


@register("logsumexp")
def lower_logsumexp(low, a, meta, where, base):
    x = a["self"]
    x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
    m = _red(low, "amax", x32, a.get("dim"), True, where)
    # eager: a row whose max is +-inf uses 0 as its shift
    shift = pointwise("where", [pointwise("isinf", [m], "bool", where), 0.0, m], "float32", where)
    e = pointwise("exp", [pointwise("sub", [x32, shift], "float32", where)], "float32", where)
    s = _red(low, "sum", e, a.get("dim"), True, where)
    out = pointwise("add", [pointwise("log", [s], "float32", where), shift], "float32", where)
    if not a.get("keepdim"):
        out = squeeze(out, list(a.get("dim") or []), where)
    return pointwise("cast", [out], out_type(meta)[1], where)


def _softmax(low, x: Val, dim: int, dtype: str, where: str, log: bool) -> Val:
    nd = len(x.shape)
    if nd and dim_index(dim, nd) != nd - 1:
        raise Unsupported(f"{where}: softmax over dim {dim}, not the last")
    x32 = x if x.dtype == "float32" else pointwise("cast", [x], "float32", where)
    m = _red(low, "amax", x32, [dim], True, where)
    d = pointwise("sub", [x32, m], "float32", where)
    e = pointwise("exp", [d], "float32", where)
    s = _red(low, "sum", e, [dim], True, where)
    if log:
        return fin("sub", [d, pointwise("log", [s], "float32", where)], dtype, where)
    return fin("div", [e, s], dtype, where)


@register("_softmax")
def lower__softmax(low, a, meta, where, base):
    return _softmax(low, a["self"], a["dim"], out_type(meta)[1], where, False)


@register("_log_softmax")
def lower__log_softmax(low, a, meta, where, base):
    return _softmax(low, a["self"], a["dim"], out_type(meta)[1], where, True)


@register("_safe_softmax")
def lower__safe_softmax(low, a, meta, where, base):
    raise Unsupported(f"{where}: _safe_softmax (its fully masked rows are zeros)")
