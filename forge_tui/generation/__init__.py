"""Greedy generation with forge: a static KV cache, decode steps replayed from CUDA graphs per
batch-size bucket, and ``forge bench WORKLOAD --generate N`` (``bench.py``).

``eager_generate(model, input_ids, new_tokens)`` is a model's own greedy generation (a Hugging Face
model's ``generate()``, a forge example's plain loop over a growing cache): the ``generate`` entry
of the bundled workloads.
"""

from __future__ import annotations

from typing import Any

from .adapters import ExampleAdapter, HFAdapter, adapter_for, generating_module
from .runner import DEFAULT_BUCKETS, Generated, GreedyRunner, RunnerStatus

__all__ = ["DEFAULT_BUCKETS", "ExampleAdapter", "Generated", "GreedyRunner", "HFAdapter", "RunnerStatus", "adapter_for",
           "eager_generate", "generating_module"]


def eager_generate(model: Any, input_ids: Any, new_tokens: int) -> Any:
    """``new_tokens`` greedy tokens after ``input_ids`` ([batch, length]), the model's own way."""
    import torch

    with torch.no_grad():
        return adapter_for(model).eager_generate(input_ids, new_tokens)
