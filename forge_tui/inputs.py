"""Input tensors for a card: its captured samples, or fresh random ones drawn from its specs.

Random sets vary the distribution per draw (normal, a few large outliers, wide uniform,
positive-only, small magnitudes; the first three are the default three sets) and never produce all zeros. Inputs whose captured values had
a restricted domain keep it: integer indices stay within the captured range, tensors that were
never negative (variances, probabilities) stay non-negative.
"""

from __future__ import annotations

from .cards import Card, TensorSpec
from .tensorstore import TensorStore, storage_extent

DISTRIBUTIONS = ("normal", "outliers", "uniform", "positive", "small")


def _as_layout(values, spec: TensorSpec, device: str):
    """``values`` (row-major) laid out with the spec's strides."""
    import torch

    n = storage_extent(spec.shape, spec.stride)
    if n < values.numel():
        # Overlapping (expanded) layout: fill the storage it reaches, then view it.
        return values.reshape(-1)[:n].to(device).as_strided(spec.shape, spec.stride, 0)
    out = torch.empty_strided(spec.shape, spec.stride, dtype=values.dtype, device=device)
    out.copy_(values.to(device))
    return out


def random_tensor(spec: TensorSpec, device: str, gen, draw: int = 0):
    """A random tensor with the spec's shape, strides and dtype; ``draw`` picks the distribution."""
    import torch

    dtype = getattr(torch, spec.dtype)
    shape = spec.shape
    lo, hi = spec.value_range if spec.value_range is not None else (None, None)
    if dtype == torch.bool:
        vals = torch.rand(shape, generator=gen) < 0.5
    elif not dtype.is_floating_point:
        a = int(lo) if lo is not None else 0
        b = int(hi) if hi is not None else 16
        vals = torch.randint(a, b + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
    else:
        kind = DISTRIBUTIONS[draw % len(DISTRIBUTIONS)]
        nonneg = lo is not None and lo >= 0
        if kind == "normal":
            vals = torch.randn(shape, generator=gen)
        elif kind == "uniform":
            vals = torch.rand(shape, generator=gen) * 8 - 4
        elif kind == "positive":
            vals = torch.rand(shape, generator=gen) * 3 + 0.05
        elif kind == "small":
            vals = torch.randn(shape, generator=gen) * 1e-2
        else:  # outliers: mostly normal, ~1% of elements 20x larger
            vals = torch.randn(shape, generator=gen)
            mask = torch.rand(shape, generator=gen) < 0.01
            vals = torch.where(mask, vals * 20, vals)
        if nonneg:
            vals = vals.abs() + (1e-3 if (lo or 0) > 0 else 0.0)
        if lo is not None and hi is not None and spec.role in ("param", "const"):
            # Parameters keep the captured scale (e.g. norm weights near 1).
            mid, half = (lo + hi) / 2, max((hi - lo) / 2, 1e-3)
            vals = mid + half * torch.tanh(vals)
        if vals.numel() and bool((vals == 0).all()):
            vals = vals + 1.0
        vals = vals.to(dtype)
    return _as_layout(vals, spec, device)


def random_inputs(card: Card, device: str, seed: int, draw: int | None = None) -> list:
    import torch

    gen = torch.Generator().manual_seed(seed)
    d = seed if draw is None else draw
    return [random_tensor(s, device, gen, d) for s in card.inputs]


def sample_inputs(card: Card, store: TensorStore, index: int, device: str) -> list:
    return [store.get(k, device) for k in card.samples[index].inputs]


def sample_outputs(card: Card, store: TensorStore, index: int, device: str) -> list:
    return [store.get(k, device) for k in card.samples[index].outputs]
