"""A tensor compared with a card's input spec (its torch dtype, shape and strides)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Spec = tuple[Any, tuple[int, ...], tuple[int, ...]]
"""A card input's torch dtype, shape and strides, as the guards compare them."""


def spec_mismatch(t: "torch.Tensor", spec: Spec, device: str) -> str | None:
    """Why ``t`` is not the card's input ``spec`` (its torch dtype, shape and strides), or None."""
    if t.device.type != device:
        return f"device {t.device.type}"
    dtype, shape, stride = spec
    if t.dtype != dtype:
        return f"dtype {str(t.dtype).removeprefix('torch.')}"
    if t.shape != shape:
        return f"shape {tuple(t.shape)}"
    if t.stride() != stride and t.numel() > 1:
        return f"strides {tuple(t.stride())}"
    return None
