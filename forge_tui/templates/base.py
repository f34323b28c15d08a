"""What every template family provides, and the header every rendered candidate carries."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..cards import Card

HEADER_RE = re.compile(r"^// forge-template: (\{.*\})$", re.M)
CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
         "int64": "int64_t", "int32": "int32_t", "bool": "bool", "uint8": "uint8_t", "int8": "int8_t"}
CPU_CTYPE = {"float32": "float", "float16": "fhalf", "bfloat16": "fbf16", "float64": "double",
             "int64": "int64_t", "int32": "int32_t", "bool": "bool", "uint8": "uint8_t", "int8": "int8_t"}
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
SMS = 132  # H200 multiprocessors: only used to choose first configurations and grid sizes
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1}


@dataclass
class Match:
    family: str
    card: Card
    info: dict[str, Any] = field(default_factory=dict)


class Family(Protocol):
    name: str

    def match(self, card: Card) -> Match | None: ...

    def axes(self, m: Match, backend: str) -> dict[str, list]:
        """Parameter axes, each a list of values valid for this card, in a sensible order."""

    def initial(self, m: Match, backend: str) -> dict:
        """The heuristic first configuration for this shape."""

    def render(self, m: Match, params: dict, backend: str) -> str: ...

    def passes(self, m: Match, params: dict) -> int:
        """Passes over the data this configuration makes (1: read once, write once)."""


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


def stash_bytes(bps: int) -> int:
    """Dynamic shared memory a block of a stash mode asks for: the most it can use while at most
    ``bps`` such blocks fit an SM's 228 KB (1 KB of which is reserved per block) and bps + 1 do not.
    The request is also how those kernels cap their blocks per SM."""
    return (228 // (bps + 1) + 4) * 1024 - 1024


RING_MAX_CHUNKS = 64  # mbarriers a ring mode block keeps (cuda_common.RING_MAX_CHUNKS)


def ring_stash(seg: int, itemsize: int, chunk: int, bps: int) -> int:
    """Elements of a ring mode block's segment kept in shared memory, in whole chunks of ``chunk``
    elements (a vector per thread): as many as fit the share of an SM's 228 KB that lets ``bps``
    blocks reside (1 KB reserved per block, 1 KB kept for the kernel's static shared memory),
    at most the segment and RING_MAX_CHUNKS chunks."""
    return min(seg, ring_cap(itemsize, bps), RING_MAX_CHUNKS * chunk) // chunk * chunk


def ring_cap(itemsize: int, bps: int) -> int:
    """Elements a ring mode block can keep in shared memory with ``bps`` blocks an SM."""
    return (228 // bps - 2) * 1024 // itemsize


def ring_launch(kernel: str, units: str, cl: int, threads: int, smem: int, args: str) -> str:
    """Host code launching a ring mode kernel on stream ``s``: a persistent grid of as many
    clusters of ``cl`` blocks as fit the GPU at once (asked of the runtime for this kernel, shared
    memory and cluster size), at most one per unit. Over 48 KB of dynamic shared memory and
    clusters over 8 blocks are opt-in, set on every call (no state kept between calls).
    (Spreading the units evenly over the rounds instead, 64 groups on 21 clusters as 4 rounds of 16
    rather than 3 of 21 and one of a single group, measured slower on the H200: group_norm fp32
    54.4 µs against 45.6, softmax 512x262144 257.9 against 251.9; run F, docs/benchmarks.md.)"""
    wide = (f"\n        cudaFuncSetAttribute({kernel}, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);"
            if cl > 8 else "")
    return f"""    {{
        cudaFuncSetAttribute({kernel}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});{wide}
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = {cl};
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {{}};
        cfg.gridDim = dim3({cl});
        cfg.blockDim = dim3({threads});
        cfg.dynamicSmemBytes = {smem};
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int fit = 0;
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
