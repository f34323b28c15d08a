"""What kind of aten call a captured call is, and the key that groups calls of one signature.

The recorder asks these per call: views, allocations and shape-dynamic ops are not cards of their
own, random ops are never replayed, and calls whose target, program and input specs agree share a
card.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..cards import TensorSpec
from ..program import Unencodable, encode

VIEW_LIKE = {"_unsafe_view", "detach", "alias", "lift_fresh", "expand", "_reshape_alias",
             "view", "as_strided", "t", "transpose", "permute", "unsqueeze", "squeeze", "slice",
             "select", "split", "chunk", "unbind", "narrow", "diagonal", "unfold", "_conj", "_neg_view"}
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "empty_permuted"}
DYNAMIC_SHAPE = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                 "unique_consecutive", "nonzero_static"}
ATTENTION_PREFIXES = ("_scaled_dot_product", "scaled_dot_product", "_flash_attention", "_efficient_attention")


def op_name(func) -> str:
    return func._overloadpacket.__name__


def is_view(func) -> bool:
    return bool(func.is_view) or op_name(func) in VIEW_LIKE


def is_rng(func, args, kwargs) -> bool:
    import torch

    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    name = op_name(func)
    if name.startswith(ATTENTION_PREFIXES):
        p = kwargs.get("dropout_p", args[3] if len(args) > 3 and isinstance(args[3], float) else 0.0)
        return bool(p and p > 0)
    return True


def call_arguments(args: Any, kwargs: Any) -> Any:
    """A module call's arguments as JSON, each tensor replaced by {"$t": k} in order of
    appearance; None when an argument has no JSON form."""
    counter = {"k": 0}

    def ref(t: Any) -> dict:
        counter["k"] += 1
        return {"$t": counter["k"] - 1}

    try:
        return encode([list(args), dict(kwargs)], ref)
    except Unencodable:
        return None


def returns_of(output: Any) -> str:
    """"tensor" for a forward returning one tensor, "tuple" for a tuple or list of tensors."""
    import torch

    if isinstance(output, torch.Tensor):
        return "tensor"
    if isinstance(output, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in output):
        return "tuple"
    return "other"


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def spec_of(t, role: str = "input", name: str = "", with_range: bool = True) -> TensorSpec:
    import torch

    value_range = None
    if with_range and not t.is_complex() and t.numel() > 0:
        v = t.detach()
        if v.dtype == torch.bool:
            v = v.to(torch.uint8)
        if v.is_floating_point():
            v = v[torch.isfinite(v)]
            if v.numel():
                value_range = (float(v.min()), float(v.max()))
        else:
            value_range = (int(v.min()), int(v.max()))
    return TensorSpec(shape=list(t.shape), stride=list(t.stride()), dtype=dtype_name(t), role=role,
                      name=name, value_range=value_range)


def signature_key(kind: str, target: str, program: dict, specs: list[TensorSpec]) -> str:
    payload = json.dumps({"kind": kind, "target": target, "program": program,
                          "inputs": [[s.shape, s.stride, s.dtype, s.role] for s in specs]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
