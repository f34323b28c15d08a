"""Lowerings of the normalisations (layer norm, group norm, batch norm in inference), written as
their fp32 steps over the reductions (reductions.var_and_mean) and rounded once."""

from __future__ import annotations

from ..values import ConstVal, Unsupported, Val, numel, pointwise
from ..views import reshape
from .reductions import var_and_mean
from .registry import out_type, register


@register("native_layer_norm")
def lower_native_layer_norm(low, a, meta, where, base):
    x = a["input"]
    ns = list(a["normalized_shape"])
    dims = list(range(len(x.shape) - len(ns), len(x.shape)))
    var, mean = var_and_mean(low, x, dims, 0, True, where)
    rstd = pointwise("rsqrt", [pointwise("add", [var, float(a["eps"])], "float32", where)], "float32", where)
    x32 = pointwise("cast", [x], "float32", where)
    y = pointwise("mul", [pointwise("sub", [x32, mean], "float32", where), rstd], "float32", where)
    if isinstance(a.get("weight"), Val):
        y = pointwise("mul", [y, a["weight"]], "float32", where)
    if isinstance(a.get("bias"), Val):
        y = pointwise("add", [y, a["bias"]], "float32", where)
    shape_y, dt_y = out_type(meta, 0)
    out = [pointwise("cast", [y], dt_y, where)]
    for k, v in ((1, mean), (2, rstd)):
        shape_k, dt_k = out_type(meta, k)
        out.append(pointwise("cast", [reshape(v, shape_k, where)], dt_k, where))
    return out


@register("native_group_norm")
def lower_native_group_norm(low, a, meta, where, base):
    x = a["input"]
    n, c, hw, g = int(a["N"]), int(a["C"]), int(a["HxW"]), int(a["group"])
    if c % g or numel(x.shape) != n * c * hw:
        raise Unsupported(f"{where}: groups that do not divide the channels")
    xg = reshape(x, (n, g, (c // g) * hw), where)
    var, mean = var_and_mean(low, xg, [2], 0, True, where)
    rstd = pointwise("rsqrt", [pointwise("add", [var, float(a["eps"])], "float32", where)], "float32", where)
    y = pointwise("mul", [pointwise("sub", [pointwise("cast", [xg], "float32", where), mean], "float32", where), rstd],
                  "float32", where)
    y = reshape(y, (n, c, hw), where)
    if isinstance(a.get("weight"), Val):
        y = pointwise("mul", [y, reshape(a["weight"], (c, 1), where)], "float32", where)
    if isinstance(a.get("bias"), Val):
        y = pointwise("add", [y, reshape(a["bias"], (c, 1), where)], "float32", where)
    shape_y, dt_y = out_type(meta, 0)
    out = [pointwise("cast", [reshape(y, shape_y, where)], dt_y, where)]
    for k, v in ((1, mean), (2, rstd)):
        shape_k, dt_k = out_type(meta, k)
        out.append(pointwise("cast", [reshape(v, shape_k, where)], dt_k, where))
    return out


def _bn_inference(x, w, b, rm, rv, eps, meta, where):
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
    out: list[Val | None] = [pointwise("cast", [y], out_type(meta, 0)[1], where)]
    for k in range(1, len(meta)):
        shape_k, dt_k = out_type(meta, k)
        if numel(shape_k) != 0:
            raise Unsupported(f"{where}: a batch norm that returns its statistics")
        out.append(ConstVal(0, shape_k, dt_k, where))
    return out


@register("_native_batch_norm_legit_no_training")
def lower__native_batch_norm_legit_no_training(low, a, meta, where, base):
    return _bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                              a["eps"], meta, where)


@register("native_batch_norm")
def lower_native_batch_norm(low, a, meta, where, base):
    if a.get("training"):
        raise Unsupported(f"{where}: a batch norm in training mode (statistics over the batch)")
    return _bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                              a["eps"], meta, where)


@register("_native_batch_norm_legit")
def lower__native_batch_norm_legit(low, a, meta, where, base):
    if a.get("training"):
        raise Unsupported(f"{where}: a batch norm in training mode (statistics over the batch)")
    return _bn_inference(a["input"], a.get("weight"), a.get("bias"), a["running_mean"], a["running_var"],
                              a["eps"], meta, where)
