"""The lowerings table (as inductor's ``lowerings``): the aten op's base name (``add`` for
``aten.add.Tensor``) -> the function that turns the op's bound arguments into values.

A lowering is ``fn(low, a, meta, where, base)``: ``low`` the program's Lowering (its context and
the reductions met so far), ``a`` the op's arguments bound to its schema's names (tensors as
values), ``meta`` the output types eager recorded (``out_type``), ``where`` the node for messages,
``base`` the op's base name. It returns the value, or a list of them (None for non-tensor outputs).
"""

from __future__ import annotations

from typing import Any, Callable

LoweringFn = Callable[..., Any]
LOWERINGS: dict[str, LoweringFn] = {}

UNARY = {"neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
         "sin", "cos", "tan", "tanh", "atan", "erf", "sigmoid", "silu", "relu", "mish", "hardsigmoid", "hardswish",
         "floor", "ceil", "round", "trunc", "sign", "square"}
BINARY = {"mul", "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor"}
IDENTITY_VIEWS = {"alias", "detach", "lift_fresh", "_conj", "view_as"}


def register(*names: str) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: ``fn`` lowers the ops ``names`` (each lowered by one function only)."""
    def deco(fn: LoweringFn) -> LoweringFn:
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"two lowerings of {name}")
            LOWERINGS[name] = fn
        return fn
    return deco


def out_type(meta, k: int = 0) -> tuple[list[int], str]:
    """Output ``k``'s shape and dtype, as eager recorded them."""
    m = meta[k]
    return list(m[0]), m[1]
