"""KV caches for forge's own example decoders (``forge_tui/examples/_decoder_parts.py``).

Both are what Hugging Face's caches are for its models: ``DynamicKV`` grows by concatenation at
every step (``DynamicCache``: new tensors each step, so a step's shapes change), ``StaticKV``
holds ``[batch, kv_heads, max_len, head_dim]`` buffers allocated once and written in place at the
step's positions (``StaticCache``: the same tensors at every step, which a CUDA graph or
``torch.compile`` needs). The decoder's attention calls ``update(layer, k, v, positions)`` and
attends to what it returns, masked by ``mask``: a key slot is seen by a query at position p when
the slot's position is at most p, so the slots of a static cache not written yet (or written by an
earlier, longer generation) are never attended to.
"""

from __future__ import annotations

from typing import Any

import torch


def causal_mask(positions: torch.Tensor, kv_length: int, dtype: torch.dtype) -> torch.Tensor:
    """``[queries, kv_length]`` additive mask: 0 where key slot j <= the query's position, the
    dtype's lowest value elsewhere. Computed on the device from ``positions`` (no host sync)."""
    slots = torch.arange(kv_length, device=positions.device)
    seen = slots[None, :] <= positions[:, None]
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=positions.device)
    return torch.where(seen, torch.zeros((), dtype=dtype, device=positions.device), low)


class DynamicKV:
    """Keys and values per layer, concatenated along the sequence at every update."""

    static = False

    def __init__(self, layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers

    def kv_length(self, new: int) -> int:
        """How many key slots an attention of ``new`` queries sees after its update."""
        k = self.keys[0]
        return new + (0 if k is None else k.shape[2])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else torch.cat((old_k, k), dim=2)
        self.values[layer] = v if old_v is None else torch.cat((old_v, v), dim=2)
        out_k, out_v = self.keys[layer], self.values[layer]
        assert out_k is not None and out_v is not None
        return out_k, out_v

    def mask(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The attention mask of queries at ``positions`` over the slots seen after their update."""
        return causal_mask(positions, self.kv_length(positions.shape[0]), dtype)

    def length(self) -> int:
        k = self.keys[0]
        return 0 if k is None else int(k.shape[2])


class StaticKV:
    """Preallocated keys and values per layer, written in place at the step's positions."""

    static = True

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: Any) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.batch = batch
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def kv_length(self, new: int) -> int:
        return self.max_len

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer].index_copy_(2, positions, k)
        self.values[layer].index_copy_(2, positions, v)
        return self.keys[layer], self.values[layer]

    def mask(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The attention mask of queries at ``positions`` over every slot of the buffers."""
        return causal_mask(positions, self.max_len, dtype)

    def reset(self) -> None:
        """Zero every slot in place (the tensors stay where a captured graph reads them)."""
        for t in (*self.keys, *self.values):
            t.zero_()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
