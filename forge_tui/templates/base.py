"""What the hand-written families share: vector widths, the cluster modes' fit and axes, the
shared-memory budgets of the stash and ring modes, the stream modes' look-ahead."""

from __future__ import annotations

from ..kernel_abi import CUDA_CTYPE
from ..kernels.device import DeviceProps

CTYPE = CUDA_CTYPE
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def vec_widths(n: int, itemsize: int) -> list[int]:
    """Elements per access, widest first: at most 16 bytes, and dividing ``n`` (no ragged tail)."""
    return [v for v in (8, 4, 2, 1) if v * itemsize <= 16 and n % v == 0]


def cluster_fits(n: int, cl: int, threads: int, vec: int) -> bool:
    """n elements split evenly over a cluster of cl blocks, each part held in its threads'
    registers (at most 64 floats a thread, 32 at 1024 threads so the launch bound's 64 registers
    do not spill)."""
    if n % (cl * vec):
        return False
    seg = n // cl
    if seg < threads * vec:
        return False
    return -(-seg // (threads * vec)) * vec <= min(64, 32768 // threads)


def stash_bytes(bps: int, device: DeviceProps) -> int:
    """Dynamic shared memory a block of a stash mode asks for: the most it can use while at most
    ``bps`` such blocks fit an SM's shared memory (1 KB of which the runtime reserves per block)
    and bps + 1 do not. The request is also how those kernels cap their blocks per SM."""
    return (device.smem_per_sm // 1024 // (bps + 1) + 4) * 1024 - 1024


RING_MAX_CHUNKS = 64  # mbarriers a ring mode block keeps (RING_MAX_CHUNKS in kernels/cuda_common.cuh)

CLUSTER_MODES = ("ring", "stash", "cluster")
"""The row families' modes that launch thread-block clusters: sm_90 and later (DeviceProps.clusters)."""
CLUSTER_AXES = ("cl", "bps", "load")
"""The axes that only the cluster modes have."""


def cluster_axes(ax: dict[str, list], device: DeviceProps) -> dict[str, list]:
    """A row family's axes as ``device`` can run them: without thread-block clusters, neither the
    cluster modes nor the axes only they have."""
    if not device.clusters:
        ax["mode"] = [mode for mode in ax["mode"] if mode not in CLUSTER_MODES]
        for k in CLUSTER_AXES:
            ax.pop(k, None)
    return ax


def cluster_mode_ok(p: dict, device: DeviceProps) -> bool:
    """False for a cluster mode on a device without clusters, and for a cluster or stash mode in
    clusters over 8 blocks (non-portable sizes: only the ring's launch opts in)."""
    mode = p.get("mode")
    if mode in CLUSTER_MODES and not device.clusters:
        return False
    return not (mode in ("cluster", "stash") and p["cl"] > 8)


def ring_stash(seg: int, itemsize: int, chunk: int, bps: int, device: DeviceProps) -> int:
    """Elements of a ring mode block's segment kept in shared memory, in whole chunks of ``chunk``
    elements (a vector per thread): as many as fit ring_cap, at most the segment and
    RING_MAX_CHUNKS chunks."""
    return min(seg, ring_cap(itemsize, bps, device), RING_MAX_CHUNKS * chunk) // chunk * chunk


def ring_cap(itemsize: int, bps: int, device: DeviceProps) -> int:
    """Elements a ring mode block can keep in shared memory with ``bps`` blocks an SM: the block's
    share of the SM's shared memory less 1 KB the runtime reserves per block and 1 KB kept for the
    kernel's static shared memory, within what one block may ask for."""
    kb = min(device.smem_per_sm // 1024 // bps - 2, device.smem_per_block // 1024 - 1)
    return kb * 1024 // itemsize


def stream_ahead(units: int, unit_bytes: int, choices: tuple[int, ...], target_bytes: int) -> int:
    """How many units (groups, rows) a stream mode's second phase trails its statistics by: the
    choice whose bytes come closest to ``target_bytes`` (what L2 should still hold), at most
    ``units``."""
    return min([a for a in choices if a <= units] or [choices[0]], key=lambda a: abs(a * unit_bytes - target_bytes))


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def input_index(ref) -> int | None:
    return ref["$in"] if isinstance(ref, dict) and "$in" in ref else None
