"""CUDA for the cuda backend.

Pointwise programs: a flat grid-stride kernel, VEC consecutive columns a thread (16-byte vector
loads and stores where an access is contiguous along the row and aligned; a VEC=1 instantiation
runs when a pointer is not aligned), grid ``full`` or capped at whole waves; ``fold`` P: a thread
computes its VEC columns in each of the row's P parts, and an element two parts read (rotate-half's
partner) is loaded once.

Programs with reductions: TPR threads a row (4 to 1024: below 32, several rows share a warp and
the shuffles stay within each row's lanes), RPB rows a block, one phase a reduction level
(warp shuffles, then shared memory across the row's warps), then the output phase. What the
phases read again is cached (``cache``): in registers (``regs``: NV x VEC values a thread, the
loops unrolled; a later phase starts from the values an earlier one computed, see ``Carry``), in
shared memory (``smem``: each thread keeps its own elements, raw), or not at
all (``none``: re-read, from L1/L2). ``grid``: a block per RPB rows, or a persistent grid of
whole waves walking the row groups. ``split`` > 1 (sm_90 and later): a row over a cluster of SPLIT
blocks (one row a cluster), each walking every SPLIT-th run of TPR x VEC columns; a reduction
level combines the blocks' partial results through distributed shared memory, in rank order, so
every block of the row gets the same value. Few long rows (a group norm's 32 groups of 262144
elements) then fill the GPU, where one block a row would leave most SMs idle. ``tiles``: rows
interleaved in memory (a channels-last group norm's groups, runs of a group's channels side by
side) walked in memory order by a cooperative grid of ``bps`` blocks an SM, each thread one row's
elements, the blocks' partial results combined behind a grid barrier (see ``emit_tiles``). On the
diffusion's group norm it is level with a cluster a row in the evaluator and takes less GPU time
under Nsight Compute; neither is bound by memory (docs/benchmarks.md).
"""

from __future__ import annotations

from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ..ir import Kernel
from .common import resident_blocks, vec_ok
from .flat import emit_flat, fold_gains, fold_loads
from .plan import cached_loads, carries, carry_plan, smem_bytes
from .rows import emit_rows
from .tiles import TileLayout, emit_tiles, tile_cached, tile_layout, tile_smem, tile_steps

__all__ = ["TileLayout", "cached_loads", "carries", "carry_plan", "emit_cuda", "fold_gains", "fold_loads",
           "resident_blocks", "smem_bytes", "tile_cached", "tile_layout", "tile_smem", "tile_steps", "vec_ok"]


def emit_cuda(kern: Kernel, params: dict, card, device: DeviceProps = DEFAULT_DEVICE) -> str:
    if kern.reductions and params.get("grid") == "tiles":
        return emit_tiles(kern, params, card, device)
    if kern.reductions:
        return emit_rows(kern, params, card, device)
    return emit_flat(kern, params, card, device)

