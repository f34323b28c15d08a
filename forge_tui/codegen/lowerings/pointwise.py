"""Lowerings of the pointwise ops (arithmetic, activations, clamps, selections, comparisons), the
copies and casts, and the constants: each a value computed element by element, in the op's dtype
with eager's rounding (``fin``: computed in fp32, rounded once)."""

from __future__ import annotations

import math

from ..ir import EXPLICIT
from ..values import ConstVal, IotaVal, TriVal, Unsupported, Val, fin, pointwise
from ..views import expand
from .registry import out_type, register


def unary(low, a, meta, where, base):
    return pointwise(base, [a["self"]], out_type(meta)[1], where)


def binary(low, a, meta, where, base):
    return pointwise(base, [a["self"], a["other"]], out_type(meta)[1], where)


def _addsub(a, meta, where, sign: str, reverse: bool = False):
    dtype = out_type(meta)[1]
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


@register("add")
def lower_add(low, a, meta, where, base):
    return _addsub(a, meta, where, "add")


@register("sub")
def lower_sub(low, a, meta, where, base):
    return _addsub(a, meta, where, "sub")


@register("rsub")
def lower_rsub(low, a, meta, where, base):
    return _addsub(a, meta, where, "sub", reverse=True)


@register("div")
def lower_div(low, a, meta, where, base):
    if a.get("rounding_mode") is not None:
        raise Unsupported(f"{where}: division with rounding_mode={a['rounding_mode']!r}")
    return pointwise("div", [a["self"], a["other"]], out_type(meta)[1], where)


@register("true_divide")
def lower_true_divide(low, a, meta, where, base):
    return lower_div(low, a, meta, where, base)


@register("pow")
def lower_pow(low, a, meta, where, base):
    dtype = out_type(meta)[1]
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


@register("gelu")
def lower_gelu(low, a, meta, where, base):
    approx = a.get("approximate") or "none"
    return pointwise("gelu_tanh" if approx == "tanh" else "gelu", [a["self"]], out_type(meta)[1], where)


@register("softplus")
def lower_softplus(low, a, meta, where, base):
    return pointwise("softplus", [a["self"]], out_type(meta)[1], where, (float(a["beta"]), float(a["threshold"])))


@register("leaky_relu")
def lower_leaky_relu(low, a, meta, where, base):
    return pointwise("leaky_relu", [a["self"]], out_type(meta)[1], where, (float(a["negative_slope"]),))


@register("elu")
def lower_elu(low, a, meta, where, base):
    return pointwise("elu", [a["self"]], out_type(meta)[1], where,
                     (float(a["alpha"]), float(a["scale"]), float(a["input_scale"])))


def _clamp(x, lo, hi, dtype, where):
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


@register("clamp")
def lower_clamp(low, a, meta, where, base):
    return _clamp(a["self"], a.get("min"), a.get("max"), out_type(meta)[1], where)


@register("clip")
def lower_clip(low, a, meta, where, base):
    return lower_clamp(low, a, meta, where, base)


@register("clamp_min")
def lower_clamp_min(low, a, meta, where, base):
    return _clamp(a["self"], a.get("min"), None, out_type(meta)[1], where)


@register("clamp_max")
def lower_clamp_max(low, a, meta, where, base):
    return _clamp(a["self"], None, a.get("max"), out_type(meta)[1], where)


@register("hardtanh")
def lower_hardtanh(low, a, meta, where, base):
    return _clamp(a["self"], a["min_val"], a["max_val"], out_type(meta)[1], where)


@register("relu6")
def lower_relu6(low, a, meta, where, base):
    return _clamp(a["self"], 0.0, 6.0, out_type(meta)[1], where)


@register("where")
def lower_where(low, a, meta, where, base):
    return pointwise("where", [a["condition"], a["self"], a["other"]], out_type(meta)[1], where)


@register("masked_fill")
def lower_masked_fill(low, a, meta, where, base):
    dtype = out_type(meta)[1]
    value = a["value"]
    if isinstance(value, Val):
        value = pointwise("cast", [value], dtype, where)
    else:
        value = ConstVal(value, (), dtype, where)
    return pointwise("where", [a["mask"], value, a["self"]], dtype, where)


def _outer(x, y, meta, where, base):
    """A matrix product over an inner dimension of 1 is an outer product, x[..., m, 1] *
    y[..., 1, n] broadcast: one product an element, rounded once at the output dtype, as eager's
    (the frequencies of every rotary embedding: inv_freq @ positions)."""
    if not isinstance(x, Val) or not isinstance(y, Val) or len(x.shape) < 2 or len(y.shape) < 2:
        raise Unsupported(f"{where}: {base} of non-matrix operands")
    if x.shape[-1] != 1 or y.shape[-2] != 1:
        raise Unsupported(f"{where}: {base} over an inner dimension of {x.shape[-1]} (a matrix product; only an "
                          "inner dimension of 1, an outer product, is pointwise)")
    return pointwise("mul", [x, y], out_type(meta)[1], where)


@register("mm")
def lower_mm(low, a, meta, where, base):
    return _outer(a["self"], a["mat2"], meta, where, base)


@register("bmm")
def lower_bmm(low, a, meta, where, base):
    return _outer(a["self"], a["mat2"], meta, where, base)


@register("addcmul")
def lower_addcmul(low, a, meta, where, base):
    dtype = out_type(meta)[1]
    prod = pointwise("mul", [a["tensor1"], a["tensor2"]], "float32", where)
    if a.get("value", 1) != 1:
        prod = pointwise("mul", [prod, a["value"]], "float32", where)
    return fin("add", [pointwise("cast", [a["self"]], "float32", where), prod], dtype, where)


@register("addcdiv")
def lower_addcdiv(low, a, meta, where, base):
    dtype = out_type(meta)[1]
    q = pointwise("div", [a["tensor1"], a["tensor2"]], "float32", where)
    if a.get("value", 1) != 1:
        q = pointwise("mul", [q, a["value"]], "float32", where)
    return fin("add", [pointwise("cast", [a["self"]], "float32", where), q], dtype, where)


@register("logical_not")
def lower_logical_not(low, a, meta, where, base):
    return pointwise("logical_not", [a["self"]], "bool", where)


@register("bitwise_not")
def lower_bitwise_not(low, a, meta, where, base):
    if a["self"].dtype != "bool":
        raise Unsupported(f"{where}: bitwise_not of an integer tensor")
    return pointwise("logical_not", [a["self"]], "bool", where)


def _bitwise(a, meta, where, op):
    if out_type(meta)[1] != "bool":
        raise Unsupported(f"{where}: a bitwise op on integers")
    return pointwise(op, [a["self"], a["other"]], "bool", where)


@register("bitwise_and")
def lower_bitwise_and(low, a, meta, where, base):
    return _bitwise(a, meta, where, "logical_and")


@register("bitwise_or")
def lower_bitwise_or(low, a, meta, where, base):
    return _bitwise(a, meta, where, "logical_or")


@register("isnan")
def lower_isnan(low, a, meta, where, base):
    return pointwise("isnan", [a["self"]], "bool", where)


@register("isinf")
def lower_isinf(low, a, meta, where, base):
    return pointwise("isinf", [a["self"]], "bool", where)


def _copy(x, meta, where):
    return pointwise("cast", [x], out_type(meta)[1], where, attr=EXPLICIT)


@register("_to_copy")
def lower__to_copy(low, a, meta, where, base):
    return _copy(a["self"], meta, where)


@register("clone")
def lower_clone(low, a, meta, where, base):
    return _copy(a["self"], meta, where)


@register("lift_fresh_copy")
def lower_lift_fresh_copy(low, a, meta, where, base):
    return _copy(a["self"], meta, where)


@register("contiguous")
def lower_contiguous(low, a, meta, where, base):
    return _copy(a["self"], meta, where)


@register("copy")
def lower_copy(low, a, meta, where, base):
    shape, dtype = out_type(meta)
    src = a["src"]
    if list(src.shape) != shape:
        src = expand(src, shape, where)
    return pointwise("cast", [src], dtype, where, attr=EXPLICIT)


@register("type_as")
def lower_type_as(low, a, meta, where, base):
    return _copy(a["self"], meta, where)


def _const(value, meta, where):
    shape, dtype = out_type(meta)
    return ConstVal(value, shape, dtype, where)


@register("full")
def lower_full(low, a, meta, where, base):
    return _const(a["fill_value"], meta, where)


@register("full_like")
def lower_full_like(low, a, meta, where, base):
    return _const(a["fill_value"], meta, where)


@register("zeros_like")
def lower_zeros_like(low, a, meta, where, base):
    return _const(0, meta, where)


@register("ones_like")
def lower_ones_like(low, a, meta, where, base):
    return _const(1, meta, where)


@register("zeros")
def lower_zeros(low, a, meta, where, base):
    return _const(0, meta, where)


@register("ones")
def lower_ones(low, a, meta, where, base):
    return _const(1, meta, where)


@register("scalar_tensor")
def lower_scalar_tensor(low, a, meta, where, base):
    return _const(a["s"], meta, where)


@register("fill")
def lower_fill(low, a, meta, where, base):
    if isinstance(a.get("value"), Val):
        shape, dtype = out_type(meta)
        return expand(pointwise("cast", [a["value"]], dtype, where), shape, where)
    return _const(a["value"], meta, where)


@register("arange")
def lower_arange(low, a, meta, where, base):
    shape, dtype = out_type(meta)
    start = a.get("start", 0)
    step = a.get("step", 1) or 1
    if not (isinstance(start, int) and isinstance(step, int)) or step < 1:
        raise Unsupported(f"{where}: arange with non-integer or negative steps")
    return IotaVal(start, step, shape[0], dtype, where)


@register("triu")
def lower_triu(low, a, meta, where, base):
    return TriVal(a["self"], int(a.get("diagonal") or 0), True, where)


@register("tril")
def lower_tril(low, a, meta, where, base):
    return TriVal(a["self"], int(a.get("diagonal") or 0), False, where)
