"""Host code the CUDA candidates share: launches in thread-block clusters, the persistent ring's
launch, the stream modes' workspace and counters, and the entry point of a candidate that takes
scratch memory. The code is in launch.cu; these fill in its sections."""

from __future__ import annotations

from .source import KernelFile

LAUNCH = KernelFile(__package__, "launch.cu")


def cluster_config(kernel: str, cl: int, grid: str, threads: str, smem: int) -> str:
    """Host code declaring ``cfg``, a launch on stream ``s`` of ``grid`` blocks of ``threads`` in
    clusters of ``cl`` (clusters over 8 blocks opt in, set on every call: no state kept between
    calls), for ``cudaLaunchKernelEx`` or an occupancy query."""
    wide = LAUNCH.fill("cluster_wide", kernel=kernel) if cl > 8 else ""
    return LAUNCH.fill("cluster_config", wide=wide, cl=cl, grid=grid, threads=threads, smem=smem)


def ring_launch(kernel: str, units: str, cl: int, threads: int, smem: int, args: str) -> str:
    """Host code launching a ring mode kernel on stream ``s``: a persistent grid of as many
    clusters of ``cl`` blocks as fit the GPU at once (asked of the runtime for this kernel, shared
    memory and cluster size), at most one per unit. Over 48 KB of dynamic shared memory and
    clusters over 8 blocks are opt-in, set on every call (no state kept between calls).
    Every cluster that fits is launched, even where the last round then has fewer units than
    clusters: spreading the units evenly over fewer clusters is slower (docs/benchmarks.md)."""
    config = cluster_config(kernel, cl, str(cl), str(threads), smem)
    return LAUNCH.fill("ring_launch", kernel=kernel, smem=smem, config=config, units=units, cl=cl, args=args)


def stream_ws_bytes(part_bytes: str, units: str) -> str:
    """A stream mode's workspace size: its partial statistics, then a finished-pieces count per
    unit and the ticket counter."""
    return LAUNCH.fill("stream_ws_bytes", part_bytes=part_bytes, units=units)


def stream_counters(units: str) -> str:
    """In a stream mode's entry point: the counters after the partials, zeroed on the stream."""
    return LAUNCH.fill("stream_counters", units=units)


def workspace_entry(bytes_expr: str) -> str:
    """The opening of a candidate that takes scratch memory (forge_kernel.h): the size function
    returning bytes_expr, then forge_launch_ws up to its opening brace (no newline after it)."""
    return LAUNCH.inline("workspace_entry", bytes=bytes_expr)
