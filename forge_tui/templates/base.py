"""What every template family provides, and the header every rendered candidate carries."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..cards import Card
from ..kernel_abi import CUDA_CTYPE
from .device import DEFAULT_DEVICE, DeviceProps

HEADER_RE = re.compile(r"^// forge-template: (\{.*\})$", re.M)
CTYPE = CUDA_CTYPE
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class Match:
    family: str
    card: Card
    info: dict[str, Any] = field(default_factory=dict)


class Family(ABC):
    """A template family: recognises the cards it serves, names the parameter axes that make sense
    for a card's shape and renders a complete candidate for any configuration (one value an axis).

    What depends on the GPU (which modes exist, first choices, grid sizes, shared-memory requests)
    is read from ``device``: the proposer passes the detected GPU's properties; DEFAULT_DEVICE
    stands for the GPU where none is present. The optional hooks below have working defaults."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The family's name (a class attribute in every family)."""

    @abstractmethod
    def match(self, card: Card) -> Match | None:
        """The match for a card this family serves, else None."""

    @abstractmethod
    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        """Parameter axes, each a list of values valid for this card, in a sensible order."""

    @abstractmethod
    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """The heuristic first configuration for this shape."""

    @abstractmethod
    def render(self, m: Match, params: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        """The complete source of the candidate for this configuration, headed by header()."""

    @abstractmethod
    def passes(self, m: Match, params: dict) -> int:
        """Passes over the data this configuration makes (1: read once, write once)."""

    def valid(self, m: Match, params: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        """Whether the configuration can be rendered and run on ``device``. By default every
        combination of the axes' values can."""
        return True

    def mode_settings(self, m: Match, mode: str, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """Settings a move into ``mode`` takes along (a thread count right for one mode can spill or
        starve another). By default none: the move changes the mode alone."""
        return {}

    def relevant(self, params: dict) -> dict:
        """The parameters that change the rendered kernel: two configurations that agree on these
        are the same move. By default all of them."""
        return dict(params)


def header(family: str, params: dict, passes: int) -> str:
    return "// forge-template: " + json.dumps({"family": family, "params": params, "passes": passes},
                                              sort_keys=True) + "\n"


def parse_header(source: str | None) -> dict | None:
    if not source:
        return None
    m = HEADER_RE.search(source)
    return json.loads(m.group(1)) if m else None


def describe(family: str, params: dict) -> str:
    return family + ": " + " ".join(f"{k}={params[k]}" for k in sorted(params))


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


RING_MAX_CHUNKS = 64  # mbarriers a ring mode block keeps (cuda_common.RING_MAX_CHUNKS)

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


def cluster_config(kernel: str, cl: int, grid: str, threads: str, smem: int) -> str:
    """Host code declaring ``cfg``, a launch on stream ``s`` of ``grid`` blocks of ``threads`` in
    clusters of ``cl`` (clusters over 8 blocks opt in, set on every call: no state kept between
    calls), for ``cudaLaunchKernelEx`` or an occupancy query."""
    wide = f"        cudaFuncSetAttribute({kernel}, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);\n" if cl > 8 else ""
    return f"""{wide}        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = {cl};
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {{}};
        cfg.gridDim = dim3({grid});
        cfg.blockDim = dim3({threads});
        cfg.dynamicSmemBytes = {smem};
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
"""


def ring_launch(kernel: str, units: str, cl: int, threads: int, smem: int, args: str) -> str:
    """Host code launching a ring mode kernel on stream ``s``: a persistent grid of as many
    clusters of ``cl`` blocks as fit the GPU at once (asked of the runtime for this kernel, shared
    memory and cluster size), at most one per unit. Over 48 KB of dynamic shared memory and
    clusters over 8 blocks are opt-in, set on every call (no state kept between calls).
    Every cluster that fits is launched, even where the last round then has fewer units than
    clusters: spreading the units evenly over fewer clusters is slower (docs/benchmarks.md)."""
    return f"""    {{
        cudaFuncSetAttribute({kernel}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});
{cluster_config(kernel, cl, str(cl), str(threads), smem)}        int fit = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, {kernel}, &cfg);
        if (e != cudaSuccess) return (int)e;
        if (fit < 1) return (int)cudaErrorInvalidConfiguration;
        const int64_t clusters = (int64_t)fit < (int64_t)({units}) ? (int64_t)fit : (int64_t)({units});
        cfg.gridDim = dim3((unsigned)(clusters * {cl}));
        e = cudaLaunchKernelEx(&cfg, {kernel}, {args});
        if (e != cudaSuccess) return (int)e;
    }}
"""


def stream_ahead(units: int, unit_bytes: int, choices: tuple[int, ...], target_bytes: int) -> int:
    """How many units (groups, rows) a stream mode's second phase trails its statistics by: the
    choice whose bytes come closest to ``target_bytes`` (what L2 should still hold), at most
    ``units``."""
    return min([a for a in choices if a <= units] or [choices[0]], key=lambda a: abs(a * unit_bytes - target_bytes))


def stream_ws_bytes(part_bytes: str, units: str) -> str:
    """A stream mode's workspace size: its partial statistics, then a finished-pieces count per
    unit and the ticket counter."""
    return (f"static const int64_t PART_BYTES = {part_bytes};\n"
            f"static const int64_t WS_BYTES = PART_BYTES + (int64_t)sizeof(unsigned) * ({units} + 1);\n")


def stream_counters(units: str) -> str:
    """In a stream mode's entry point: the counters after the partials, zeroed on the stream."""
    return (f"    unsigned* done = (unsigned*)((char*)workspace + PART_BYTES);\n"
            f"    unsigned* ticket = done + {units};\n"
            f"    /* the counters start at zero on every call (the workspace holds garbage) */\n"
            f"    cudaMemsetAsync(done, 0, sizeof(unsigned) * ({units} + 1), s);\n")


def workspace_entry(bytes_expr: str) -> str:
    """The opening of a candidate that takes scratch memory (forge_kernel.h): the size function
    returning bytes_expr, then forge_launch_ws up to its opening brace."""
    return f"""FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* in, int32_t n_in, const forge_tensor* out,
                                           int32_t n_out, const forge_scalar* sc, int32_t n_sc) {{
    return {bytes_expr};
}}

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {{"""


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def input_index(ref) -> int | None:
    return ref["$in"] if isinstance(ref, dict) and "$in" in ref else None
