"""Bytes moved and floating-point operations of one op call.

Bytes: every input element read once (an expanded tensor counts its storage once) and every output written once. FLOPs: torch's own flop formulas
(``torch.utils.flop_counter``) for matrix products, convolutions and attention; otherwise one
operation per element of the largest tensor involved, which is the right order for pointwise
ops, reductions and normalisations (they are memory-bound; their floor is set by bytes).
"""

from __future__ import annotations

from ..tensorstore import storage_extent

# Ops whose flop formula torch registers under a sibling's name.
_FLOP_ALIASES = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "mkldnn_convolution": "convolution",
}


def tensor_read_bytes(t) -> int:
    """Each distinct element once: the reachable storage span for an overlapping (expanded)
    layout, the element count for any other (a strided slice reads only its elements)."""
    return min(storage_extent(tuple(t.shape), tuple(t.stride())), t.numel()) * t.element_size()


def tensor_write_bytes(t) -> int:
    return t.numel() * t.element_size()


def op_flops(func, args, kwargs, out, in_tensors, out_tensors) -> int:
    import torch
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    formula = flop_registry.get(packet)
    if formula is None:
        alias = _FLOP_ALIASES.get(packet.__name__)
        if alias is not None:
            formula = flop_registry.get(getattr(torch.ops.aten, alias))
    if formula is not None:
        try:
            return int(formula(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - a formula that does not fit this overload
            pass
    sizes = [t.numel() for t in list(in_tensors) + list(out_tensors)]
    return max(sizes) if sizes else 0
