"""The code every candidate starts with, read from its kernel files: the CUDA candidates' device
code (cuda_common.cuh), the C++ candidates' (cpu_common.h), and the scalar helpers the generated
kernels and the elementwise family share (scalar_helpers.h; fast_math.cuh for ``math=fast``)."""

from __future__ import annotations

from .source import KernelFile

CUDA_COMMON = KernelFile(__package__, "cuda_common.cuh").section("common")
CPU_COMMON = KernelFile(__package__, "cpu_common.h").section("common")
HELPERS = KernelFile(__package__, "scalar_helpers.h").section("helpers")
"""Scalar helpers for both backends; the including code defines FG, the function qualifier."""
FAST_HELPERS = KernelFile(__package__, "fast_math.cuh").section("fast")
"""The hardware's approximate functions (cuda, ``math=fast``); FG as for HELPERS."""
HALF = ("bfloat16", "float16")
