"""Generated kernels: any card whose program is pointwise ops, casts, views that are index
arithmetic and reductions over the last dimensions (forge_tui/codegen) becomes one fused kernel.
Tried after every hand-written family, so those keep the cards they match.

Axes (cuda, programs with reductions): ``tpr`` threads a row, ``rpb`` rows a block, ``vec``
elements an access, ``cache`` (what later phases read again: registers, shared memory, or
re-read), ``grid`` (a block per row group, or a persistent grid of whole waves). Pointwise
programs: ``threads``, ``vec``, ``grid``, ``fold`` (a thread computes its columns in each of
the row's 1, 2 or 4 parts, offered where that reads fewer vectors: rotate-half's partner is the
other part's own element), and ``launch`` where the outputs differ in size (a kernel a size, or
one launch whose blocks are split among them). cpu: ``chunk`` rows an OpenMP chunk, ``simd``, and
``cblock`` (columns a work item) for pointwise programs. ``split`` (cuda, sm_90 and later): blocks a
row, a cluster of them sharing its reductions (few long rows: a group norm's groups). ``grid`` =
``tiles`` with ``bps`` blocks an SM (cuda, rows interleaved in memory: a channels-last group
norm): the whole GPU walks the tensor in memory order, the rows' sums combined behind a grid
barrier. ``math`` (programs that round inside or call tanh, exp or sigmoid with half-precision
outputs): ``eager`` rounds every op's result as eager does, ``fp32`` only the outputs and explicit
casts (as torch.compile; a bf16 NewGELU's eight conversions run on the GPU's quarter-rate pipe and
bound it at 45% of a copy), ``fast`` (cuda) also takes the hardware's approximate tanh and exp.
The evaluator decides whether a mode is close enough to eager.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from ..cards import Card
from ..kernel_abi import ITEMSIZE
from ..kernels.device import DEFAULT_DEVICE, DeviceProps
from ..kernels.family import Family, Match, header
from ..kernels.family import describe as _describe
from .analyze import Unsupported, analyze
from .emit_common import math_modes
from .emit_cpu import PRELUDE as CPU_PRELUDE
from .emit_cpu import emit_cpu
from .emit_cuda import (
    cached_loads,
    emit_cuda,
    fold_gains,
    resident_blocks,
    smem_bytes,
    tile_cached,
    tile_layout,
    tile_smem,
    tile_steps,
    vec_ok,
)
from .emit_cuda.common import PRELUDE as CUDA_PRELUDE
from .index import Index
from .ir import FLOATS, Kernel

TPRS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
RPBS = [1, 2, 4, 8, 16, 32, 64]
SPLITS = [1, 2, 4, 8, 16]
RPTS = [1, 2, 4, 8]
"""Rows a thread: a thread's rows loaded before any is reduced (torch.compile's kernel for the
Qwen-3 per-head norm, 128 columns: 64 threads a block, 32 rows, 8 rows a thread)."""
BPS = [1, 2, 4]


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class _Cache:
    """Analyses by card (id and program): the proposer asks about a card many times."""

    def __init__(self, size: int = 256) -> None:
        self.items: OrderedDict[str, Kernel | str] = OrderedDict()
        self.size = size
        self.lock = threading.Lock()

    def get(self, card: Card) -> Kernel | str:
        key = hashlib.sha256(json.dumps([card.id, card.program, [s.model_dump() for s in card.inputs],
                                         [s.model_dump() for s in card.outputs]], sort_keys=True,
                                        default=str).encode()).hexdigest()
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit
        try:
            value: Kernel | str = analyze(card)
        except Unsupported as exc:
            value = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug of the generator must not stop a search
            value = f"the generator failed on this program ({type(exc).__name__}: {exc})"
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


_CACHE = _Cache()


def describe_params(p: dict) -> str:
    return _describe("generated", p)


def kernel_or_reason(card: Card) -> Kernel | str:
    """The generated kernel's analysis for the card, or the one-line reason there is none."""
    return _CACHE.get(card)


RANGE_AXES: dict[str, list[object]] = {"grid": ["full", "rows"], "split": [1], "rpt": [1], "launch": ["each"]}
"""For a range card, the values of these axes its source can take: grids whose launches read
the sizes alone (a block per row group, or every element), one block a row, one row a thread,
one launch a kernel (see ranged.py)."""

_RANGED: OrderedDict[str, tuple[bool, str]] = OrderedDict()
_RANGED_LOCK = threading.Lock()


def _range_key(card: Card, p: dict, backend: str, device: DeviceProps) -> str:
    return hashlib.sha256(json.dumps([card.id, card.program, [s.model_dump() for s in card.inputs],
                                      {k: r.model_dump() for k, r in card.ranges.items()}, p, backend,
                                      repr(device)], sort_keys=True, default=str).encode()).hexdigest()


class Generated(Family):
    name = "generated"

    # ---- range cards -----------------------------------------------------------------------------
    def _range_source(self, m: Match, p: dict, backend: str, device: DeviceProps) -> str:
        """The one source for the range card's whole range at configuration ``p`` (ranged.py), or
        Unsupported with the reason; remembered by card and configuration."""
        from .ranged import RangeSource

        key = _range_key(m.card, p, backend, device)
        with _RANGED_LOCK:
            hit = _RANGED.get(key)
        if hit is None:
            def render_at(card: Card) -> str:
                k = kernel_or_reason(card)
                if isinstance(k, str):
                    raise Unsupported(f"range: at {card.label}: {k}")
                em = Match(self.name, card, {"kernel": k})
                if not self._valid_exact(em, p, backend, device):
                    raise Unsupported(f"range: {describe_params(p)} cannot run at {card.label}")
                return emit_cpu(k, p, card) if backend == "cpu" else emit_cuda(k, p, card, device)

            prelude = CPU_PRELUDE if backend == "cpu" else CUDA_PRELUDE
            try:
                hit = (True, RangeSource(m.card, render_at, prelude).source())
            except Unsupported as exc:
                hit = (False, str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug of the generator must not stop a search
                hit = (False, f"range: the generator failed ({type(exc).__name__}: {exc})")
            with _RANGED_LOCK:
                _RANGED[key] = hit
                while len(_RANGED) > 128:
                    _RANGED.popitem(last=False)
        if not hit[0]:
            raise Unsupported(hit[1])
        return hit[1]

    def range_reason(self, m: Match) -> str | None:
        """None where the first configuration's source serves the whole range (ranged.py: the
        generator's code at sampled sizes, its sizes fitted as polynomials), else why not."""
        from ..ranges import range_reason

        if range_reason(m.card) is not None:  # said first, in the card's own line
            return "generated: no kernel can size the card's output at run time"
        why = None
        for backend in ("cuda", "cpu"):
            try:
                self._range_source(m, self.initial(m, backend), backend, DEFAULT_DEVICE)
                return None
            except Unsupported as exc:
                why = why or f"generated: {exc}"
        return why

    def match(self, card: Card) -> Match | None:
        k = kernel_or_reason(card)
        if isinstance(k, str):
            return None
        return Match(self.name, card, {"kernel": k})

    @staticmethod
    def _k(m: Match) -> Kernel:
        return m.info["kernel"]

    # ---- the parameter space ---------------------------------------------------------------------
    def _vec_accesses(self, k: Kernel) -> list[tuple[Index, str]]:
        out = []
        for d in k.domains:
            for n in d.loads():
                if n.varying and n.kind == "f":
                    out.append((n.attr[1], n.dtype))
            for o in d.outputs:
                if not o.per_row and o.dtype in FLOATS:
                    out.append((o.offset, o.dtype))
        return out

    def _vecs(self, k: Kernel) -> list[int]:
        """The vector widths every access of the kernel (of each of its domains) allows (computed
        once a kernel: the search asks for every configuration it considers)."""
        hit = k.memo.get("vecs")
        if hit is None:
            acc = self._vec_accesses(k)
            widths = []
            for v in (8, 4, 2):
                if any(d.cols % v for d in k.domains):
                    continue
                ok = [dt for off, dt in acc if vec_ok(off, v)]
                if ok and all(v * ITEMSIZE[dt] <= 16 for dt in ok):
                    widths.append(v)
            hit = k.memo["vecs"] = widths + [1]
        return list(hit)

    def _folds(self, k: Kernel) -> list[int]:
        """1, and the ways of folding a row (see emit_cuda.flat) that read fewer vectors an
        element at some vector width."""
        hit = k.memo.get("folds")
        if hit is None:
            hit = k.memo["folds"] = [1] + [f for f in (2, 4) if any(fold_gains(d, f, v) for v in self._vecs(k)
                                                                   for d in k.domains)]
        return list(hit)

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        ax = self._axes(m, backend, device)
        modes = math_modes(self._k(m), backend)
        if len(modes) > 1:
            ax["math"] = modes
        if m.card.ranges:
            ax = {k: ([v for v in vals if v in RANGE_AXES[k]] if k in RANGE_AXES else vals) for k, vals in ax.items()}
            ax.pop("bps", None)
        return ax

    def _axes(self, m: Match, backend: str, device: DeviceProps) -> dict[str, list]:
        k = self._k(m)
        if backend == "cpu":
            ax: dict[str, list] = {"chunk": [1, 4, 16, 64], "simd": [1, 0]}
            if not k.reductions:
                ax["cblock"] = [0, 1024, 4096, 16384]
            return ax
        if not k.reductions:
            return {"threads": [128, 256, 512], "vec": self._vecs(k), "grid": ["full", "waves4", "waves1"],
                    "fold": self._folds(k), "launch": ["each", "one"] if k.more else ["each"]}
        ax = {"tpr": TPRS, "rpb": RPBS, "rpt": RPTS, "vec": self._vecs(k), "cache": ["regs", "smem", "none"],
              "grid": ["rows", "waves"], "split": SPLITS if device.clusters else [1]}
        if tile_layout(k) is not None:  # rows interleaved in memory: also walked in memory order
            ax["grid"] = ["tiles", "rows", "waves"]
            ax["bps"] = BPS
        return ax

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if not m.card.ranges:
            return self._valid_exact(m, p, backend, device)
        if any(k in p and p[k] not in vals for k, vals in RANGE_AXES.items()) or "bps" in p:
            return False
        try:
            self._range_source(m, p, backend, device)
        except Unsupported:
            return False
        return True

    def _valid_exact(self, m: Match, p: dict, backend: str, device: DeviceProps) -> bool:
        k = self._k(m)
        if p.get("math", "eager") not in math_modes(k, backend):
            return False
        if backend == "cpu":
            return not (p.get("cblock") and k.reductions)
        if p["vec"] not in self._vecs(k):
            return False
        if not k.reductions:
            fold = p.get("fold", 1)
            if p.get("launch", "each") == "one" and (not k.more or p["grid"] != "full"):
                return False  # one launch for several sizes: each size's whole grid, in turn
            return fold == 1 or (fold in self._folds(k) and any(fold_gains(d, fold, p["vec"]) for d in k.domains))
        tpr, rpb, vec, cache = p["tpr"], p["rpb"], p["vec"], p["cache"]
        split = p.get("split", 1)
        if p["grid"] == "tiles":
            return self._valid_tiles(k, p, device)
        if p.get("bps", 1) != 1:
            return False  # blocks an SM: the tiles grid's setting
        rpt = p.get("rpt", 1)
        if rpt > 1 and (split > 1 or cache == "smem" or -(-k.rows // (p["rpb"] * rpt)) < device.sms):
            return False  # a thread's rows in registers, with blocks enough for every SM
        if tpr * rpb > 1024 or (tpr * rpb) % 32 or (rpb > 1 and tpr > 256):
            return False
        if split > 1 and (not device.clusters or rpb > 1 or p["grid"] != "rows" or cache == "smem"
                          or k.cols < split * tpr * vec or k.rows >= device.sms):
            return False  # a cluster a row: for rows too few to fill the GPU, each block a share of the columns
        if tpr * vec > 2 * _pow2_ceil(k.cols) and tpr > 4:
            return False
        groups = -(-k.rows // rpb)
        if p["grid"] == "waves" and groups <= device.sms * resident_blocks(tpr * rpb, device):
            return False  # a wave holds every group: the same launch as "rows"
        cached = cached_loads(k)
        if cache == "regs":
            nv = -(-k.cols // (tpr * vec * split))
            return nv * vec * max(1, len(cached)) * rpt <= 64
        if not cached:
            return False  # nothing is read twice: every cache setting is the same kernel
        if cache == "smem":
            if any(not vec_ok(k.nodes[n].attr[1], vec) for n in cached):
                return False  # the shared-memory copy is filled a whole run at a time
            need = smem_bytes(k, rpb, vec)
            return 0 < need <= device.smem_per_block - 2048
        return True

    @staticmethod
    def _valid_tiles(k: Kernel, p: dict, device: DeviceProps) -> bool:
        """A tiles grid (see emit_cuda.tiles): ``bps`` blocks of ``tpr`` threads on every
        SM at once (a cooperative launch), each step of the grid a whole number of the layout's
        periods, every row's threads in a block known, what is cached within the SM's memory."""
        lay = tile_layout(k)
        tpr, vec, cache, bps = p["tpr"], p["vec"], p["cache"], p.get("bps", 1)
        if lay is None or p["rpb"] != 1 or p.get("split", 1) != 1 or p.get("rpt", 1) != 1 or lay.rl % vec:
            return False
        blocks = device.sms * bps
        if tpr < 32 or tpr % 32 or tpr % k.rows or tpr * bps > device.max_threads_per_sm:
            return False
        if (tpr * vec) % lay.per:
            return False  # a run of the block is whole periods: each thread's elements one row's
        cached = tile_cached(k, "smem")
        if cache != "none" and not cached:
            return False  # nothing is read twice: every cache setting is the same kernel
        nstep = tile_steps(k, tpr, vec, blocks)
        if lay.transposed:
            pix = nstep * tpr * vec // lay.per
            if cache == "regs" or pix % vec or (k.rows * k.cols // lay.per) % vec:
                return False  # written a channel's run of pixels at a time, from the block's chunk
        if cache == "regs":
            return nstep * vec * len(cached) <= min(64, device.max_threads_per_sm * 32 // (tpr * bps) - 40)
        if cache == "smem":
            need = tile_smem(k, "smem", tpr, vec, blocks)[-1]
            static = 8 * tpr + 4 * len(k.reductions) * k.rows
            return need + static <= device.smem_per_block - 1024 and (need + static + 1024) * bps <= device.smem_per_sm
        return True

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """The heuristic first configuration; ``math`` starts at ``eager`` (bit for bit where eager
        is exact) where the program has other modes. For a range card, the first of these that
        serves the whole range: the exact card's own, then with the range's axes, with one
        element an access, unfolded."""
        p = self._initial(m, backend, device)
        if len(math_modes(self._k(m), backend)) > 1:
            p["math"] = "eager"
        if not m.card.ranges:
            return p
        ranged = {**p, **{k: vals[0] for k, vals in RANGE_AXES.items() if k in p and p[k] not in vals}}
        ranged.pop("bps", None)
        if not self._k(m).reductions:
            ranged["grid"] = "full"
        tries = [ranged, {**ranged, "vec": 1}, {**ranged, "vec": 1, "fold": 1} if "fold" in ranged else None]
        for t in tries:
            if t is not None and self.valid(m, t, backend, device):
                return t
        return ranged

    def _initial(self, m: Match, backend: str, device: DeviceProps) -> dict:
        k = self._k(m)
        if backend == "cpu":
            p: dict = {"chunk": 4 if k.rows >= 256 else 1, "simd": 1}
            if not k.reductions:
                p["cblock"] = 0 if k.rows >= 64 else (16384 if k.cols >= 65536 else 4096 if k.cols >= 8192 else 0)
            return p
        vec = self._vecs(k)[0]
        if not k.reductions:
            # folded where that reads each element once: rotate-half unfolded reads its input
            # three times a column, folded in two once (docs/benchmarks.md)
            fold = next((f for f in self._folds(k) if f > 1 and any(fold_gains(d, f, vec) for d in k.domains)), 1)
            return {"threads": 256, "vec": vec, "grid": "full", "fold": fold, "launch": "each"}
        tpr = max(4, min(1024, _pow2_ceil(-(-k.cols // (2 * vec)))))
        base = {"vec": vec, "cache": "regs", "grid": "rows", "split": 1}
        if tile_layout(k) is not None:
            base["bps"] = 1
            if k.rows < device.sms:
                # few rows interleaved in memory: the whole GPU walks the tensor in memory order,
                # the largest blocks first (on the diffusion's group norm 1024 threads twice an SM
                # run faster than 512)
                for cache in ("regs", "smem", "none"):
                    for t, bps in ((1024, 2), (512, 2), (1024, 1), (256, 4)):
                        p = {**base, "grid": "tiles", "tpr": t, "rpb": 1, "cache": cache, "bps": bps}
                        if self.valid(m, p, backend, device):
                            return p
        if k.rows < device.sms and device.clusters:
            # too few rows to fill the GPU a block each: the fewest blocks a row that do, the row
            # in registers (a 1024-thread block a cluster rank)
            for split in SPLITS[1:]:
                if k.rows * split < device.sms and split < SPLITS[-1]:
                    continue
                for t in (1024, 512, 256):
                    p = {**base, "tpr": t, "rpb": 1, "split": split}
                    if self.valid(m, p, backend, device):
                        return p
        for cache in ("regs", "smem", "none"):
            t = tpr
            while t <= 1024:
                rpb = max(1, 256 // t) if t <= 128 else 1
                while t * rpb < 32:
                    rpb *= 2
                p = {**base, "tpr": t, "rpb": min(rpb, 64), "rpt": 1, "cache": cache}
                if self.valid(m, p, backend, device):
                    return p
                t *= 2
        return {**base, "tpr": 256, "rpb": 1, "cache": "none"}

    def passes(self, m: Match, p: dict) -> int:
        k = self._k(m)
        if p.get("cache") == "none" and cached_loads(k):
            return k.levels + 1
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        k = self._k(m)
        if m.card.ranges:
            src = self._range_source(m, p, backend, device)
        else:
            src = emit_cpu(k, p, m.card) if backend == "cpu" else emit_cuda(k, p, m.card, device)
        return header(self.name, p, self.passes(m, p)) + src
