"""The ways a model runs that ``apply`` serves: op by op, compiled, captured in CUDA graphs."""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    INFERENCE = "inference"
    TORCH_COMPILE = "torch_compile"
    CUDA_GRAPH = "cuda_graph"
    """For a model the caller captures in a CUDA graph: a graph replays the kernels alone, so what
    a call costs the host does not count. Kernels are chosen by their verdict in graphs
    (``Entry.graph_disabled_reason``), not by the op-by-op one, none is switched off for its
    dispatch cost, and there are no in-place trial and no shadow checks (they synchronise, which a
    capture forbids)."""
