"""softmax and log_softmax over the last dimension, any float dtype in and out (the upcast
variants models use: bf16 in, fp32 out).

CUDA modes:
  regs   one pass: a row held in registers (TPR threads per row, RPB rows per block, VEC-wide
         16-byte accesses); the row is read once and written once.
  online two passes over global memory in one block per row (running max and sum, then write):
         for rows too long for registers.
  split  rows cut into SEGS segments on separate blocks (partial max/sum into the caller's
         workspace, then a merge and the write): for a handful of long rows (decode shapes), where
         one block per row would leave most of the GPU idle. Two passes; with ORDER=reverse the
         write kernel walks the blocks backwards, so its first reads are the ones the statistics
         kernel made last, still in L2.
  cluster one pass for rows too long for one block's registers: a thread-block cluster of CL
         blocks (sm_90) holds a row in registers, the blocks exchange their partial max and sum
         through distributed shared memory, and each writes its part. The row is read once.
  stash  one read from DRAM for long rows, with several blocks an SM: a cluster of CL blocks per
         row, each keeping (the first part of) its segment in shared memory while it accumulates
         the running max and sum; the partials meet in distributed shared memory and the write
         pass reads the stash (and re-reads any rest, from L2). The shared-memory request caps the
         blocks per SM at BPS, so the rows in flight fit on chip.
  ring   one DRAM read, persistent, for many long rows: a cluster of CL blocks walks rows (cid,
         cid + clusters, ...), each block keeping its segment in shared memory (the part that fits BPS
         blocks an SM; any rest is read twice; more blocks share an SM where the stash is smaller than
         that share: clusters of 8 on 512x262144 bf16 run three an SM). LOAD=bulk: the segment arrives in chunks by bulk
         copies (TMA), one mbarrier a chunk, the statistics of a chunk starting as it lands; once the
         block has written a row, the next row's chunks are requested while those stores drain.
         LOAD=thread: each thread stages its own elements of the next row (cp.async) as soon as it
         has written them for this one.
  stream one launch for many long rows: blocks take work items in order from a ticket counter; the
         items are the (max, sum) of piece p of row r and, AHEAD rows later in the order, the write
         of that piece, which waits for its row's statistics. New rows are read while finished ones
         are written, and the second read of a piece comes from L2 when AHEAD rows fit it.

The CUDA code is in softmax.cuh (device) and softmax.cu (entry points), the C++ in softmax.cpp,
the row layout's XROW macro in softmax_rows.h.
"""

from __future__ import annotations

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.launch import ring_launch, stream_counters, stream_ws_bytes, workspace_entry
from ...kernels.source import KernelFile
from ..base import (
    CTYPE,
    FLOAT_DTYPES,
    cluster_axes,
    cluster_fits,
    cluster_mode_ok,
    numel,
    ring_cap,
    ring_stash,
    stash_bytes,
    stream_ahead,
    vec_widths,
)

CUH = KernelFile(__package__, "softmax.cuh")
CU = KernelFile(__package__, "softmax.cu")
CPP = KernelFile(__package__, "softmax.cpp")
ROWS_H = KernelFile(__package__, "softmax_rows.h")
TARGETS = {"aten._softmax.default": False, "aten._log_softmax.default": True}


def row_layout(shape: list[int], stride: list[int], itemsize: int) -> tuple[tuple[int, int], ...] | None:
    """Where the rows of a softmax's input start: the dims before the last, merged where they
    nest and without those of size 1, as (count, stride in elements) pairs, outermost first;
    contiguous rows are ((rows, cols),). None where the rows are not contiguous in memory or
    need more than two pairs, or where a strided row would not start on a 16-byte boundary
    (the vector loads and bulk copies need it): the logits of the last positions,
    ``logits[:, -k:, :]``, are two pairs."""
    if not shape:
        return ((1, 1),)
    cols = shape[-1]
    if cols != 1 and stride[-1] != 1:
        return None
    dims = [(n, st) for n, st in zip(shape[:-1], stride[:-1]) if n != 1]
    merged: list[tuple[int, int]] = []
    for n, st in dims:
        if merged and merged[-1][1] == st * n:
            merged[-1] = (merged[-1][0] * n, st)
        else:
            merged.append((n, st))
    if not merged:
        return ((1, cols),)
    if len(merged) == 1 and merged[0][1] == cols:
        return ((merged[0][0], cols),)
    if len(merged) > 2 or any(st < cols or (st * itemsize) % 16 for _, st in merged):
        return None
    return tuple(merged)


def _xrow_macro(xrows: tuple[tuple[int, int], ...]) -> str:
    """XROW(r): the element offset of input row r, as the kernels read it."""
    if len(xrows) == 1:
        return ROWS_H.fill("one", s0=xrows[0][1])
    (_, s0), (n1, s1) = xrows
    return ROWS_H.fill("two", n1=n1, s0=s0, s1=s1)


def _xrows(m: "Match") -> tuple[tuple[int, int], ...]:
    """The match's row layout (``row_layout``); contiguous rows where it names none."""
    return m.info.get("xrows") or ((m.info["rows"], m.info["cols"]),)


def _x_check(m: "Match") -> str:
    """The entry point's check of the input's layout: contiguous, or the card's own strides."""
    xrows = _xrows(m)
    if len(xrows) == 1 and xrows[0][1] == m.info["cols"]:
        return "!forge_is_contiguous(&in[0])"
    shape, stride = m.card.inputs[0].shape, m.card.inputs[0].stride
    conds = [f"in[0].ndim != {len(shape)}"] + [f"in[0].shape[{k}] != {n} || in[0].stride[{k}] != {st}"
                                               for k, (n, st) in enumerate(zip(shape, stride)) if n != 1]
    return "(" + " || ".join(conds) + ")"


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class Softmax(Family):
    name = "softmax"

    def match(self, card: Card) -> Match | None:
        if len(card.inputs) != 1 or len(card.outputs) != 1:
            return None
        nodes = card.program["nodes"]
        if card.kind in (CardKind.MODULE, CardKind.CHAIN):
            # upcast then softmax, as F.softmax(x, dim, dtype=torch.float32) runs in eager
            if len(nodes) != 2 or nodes[0]["op"] != "aten._to_copy.default" or nodes[1]["op"] not in TARGETS:
                return None
            if nodes[1]["args"][0] != {"$node": 0, "out": 0} or nodes[0]["args"][0] != {"$in": 0}:
                return None
            target = nodes[1]["op"]
            node = nodes[1]
        elif card.target in TARGETS:
            target, node = card.target, nodes[0]
        else:
            return None
        x, y = card.inputs[0], card.outputs[0]
        dim = node["args"][1]
        nd = len(x.shape)
        if nd == 0 or not isinstance(dim, int) or dim not in (-1, nd - 1):
            return None
        if x.dtype not in FLOAT_DTYPES or y.dtype not in FLOAT_DTYPES or not y.contiguous:
            return None
        cols = x.shape[-1]
        rows = numel(x.shape) // max(cols, 1)
        if cols == 0 or rows == 0:
            return None
        xrows = row_layout(list(x.shape), list(x.stride), ITEMSIZE[x.dtype])
        if xrows is None:
            return None
        return Match(self.name, card, {"rows": rows, "cols": cols, "tin": x.dtype, "tout": y.dtype,
                                       "log": TARGETS[target], "xrows": xrows})

    # ---- parameter space -------------------------------------------------------------------------
    def _vecs(self, m: Match) -> list[int]:
        """At most 16 bytes on the wider side: with bf16 in and fp32 out, 8 elements a thread would
        mean 32-byte stores, each sector written in two halves by two instructions, which is slower
        (docs/benchmarks.md)."""
        return vec_widths(m.info["cols"], max(ITEMSIZE[m.info["tin"]], ITEMSIZE[m.info["tout"]]))

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16, 64]}
        cols = m.info["cols"]
        modes = ["ring", "stream", "stash", "online", "split", "cluster"]
        if cols <= 1024 * 8 * 8:
            modes.insert(0, "regs")
        ax: dict[str, list] = {"mode": modes, "tpr": [32, 64, 128, 256, 512, 1024], "rpb": [1, 2, 4, 8],
                               "vec": self._vecs(m), "segs": [2, 4, 8, 16, 32, 64, 128], "order": ["reverse", "forward"],
                               "cl": [2, 4, 8, 16], "bps": [1, 2, 4], "ahead": [4, 8, 16, 32], "load": ["bulk", "thread"]}
        return cluster_axes(ax, device)

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        cols = m.info["cols"]
        if p["tpr"] * p["rpb"] > 1024 or (p["rpb"] > 1 and p["tpr"] > 256):
            return False
        if p["vec"] not in self._vecs(m):
            return False
        if not cluster_mode_ok(p, device):
            return False
        if p["mode"] == "ring":
            itemsize = ITEMSIZE[m.info["tin"]]
            if p["rpb"] != 1 or cols % (p["cl"] * p["vec"]) or (cols // p["cl"] * itemsize) % 16 \
                    or p["tpr"] * p["bps"] > device.max_threads_per_sm:
                return False  # (bulk copies move multiples of 16 bytes from 16-byte boundaries)
            return ring_stash(cols // p["cl"], itemsize, p["tpr"] * p["vec"], p["bps"], device) > 0
        if p["mode"] == "regs":
            nv = -(-cols // (p["tpr"] * p["vec"]))
            return nv * p["vec"] <= 64 and p["tpr"] * p["vec"] <= _pow2_ceil(cols) * 2
        if p["mode"] == "split":
            return p["rpb"] == 1 and cols // p["segs"] >= p["tpr"] * p["vec"]
        if p["mode"] == "cluster":
            return p["rpb"] == 1 and cluster_fits(cols, p["cl"], p["tpr"], p["vec"])
        if p["mode"] == "stream":
            return (p["rpb"] == 1 and cols % p["segs"] == 0 and (cols // p["segs"]) % (p["tpr"] * p["vec"]) == 0
                    and p["ahead"] <= m.info["rows"])
        if p["mode"] == "stash":
            return (p["rpb"] == 1 and cols % (p["cl"] * p["vec"]) == 0 and cols // p["cl"] >= p["tpr"] * p["vec"]
                    and p["tpr"] * p["bps"] <= device.max_threads_per_sm
                    and stash_bytes(p["bps"], device) + 1024 <= device.smem_per_block)  # (1 KB of static shared memory)
        return p["rpb"] == 1

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 4}
        rows, cols = m.info["rows"], m.info["cols"]
        vec = self._vecs(m)[0]
        row_bytes = cols * (ITEMSIZE[m.info["tin"]] + ITEMSIZE[m.info["tout"]])
        # the stream mode re-reads a piece to write it AHEAD rows after its first read: from L2,
        # where those rows' inputs and outputs are to take about two fifths of it
        ahead = stream_ahead(rows, row_bytes, (4, 8, 16, 32), device.l2_bytes * 2 // 5)
        base = {"rpb": 1, "vec": vec, "segs": 8, "order": "reverse", "cl": 8, "bps": 2,
                "ahead": ahead, "load": "bulk"}  # every axis has a value
        if cols <= 1024 * 8 * 8 and rows >= device.sms:
            per_thread = 16 if ITEMSIZE[m.info["tin"]] == 4 else 16
            tpr = min(1024, max(32, _pow2_ceil(-(-cols // per_thread))))
            tpr = max(tpr, 32)
            while tpr * vec > _pow2_ceil(cols) and tpr > 32:
                tpr //= 2
            rpb = max(1, min(8, 256 // tpr)) if tpr <= 128 else 1
            return {**base, "mode": "regs", "tpr": tpr, "rpb": rpb}
        if rows < 2 * device.sms:
            segs = min(128, _pow2_ceil(max(1, (4 * device.sms) // rows)))
            while segs > 2 and cols // segs < 256 * vec:
                segs //= 2
            return {**base, "mode": "split", "tpr": 1024 if cols // segs >= 4096 * vec else 256, "segs": segs}
        # Many long rows: rows of 256 KB of input and more go to the persistent ring (_ring), one
        # DRAM read, clusters walking the rows and the next row's loads overlapping this row's
        # writes; other rows to two passes from DRAM in a block per row (online), faster on them
        # than one pass in a cluster or the stash. Accesses are 16 bytes on the wider side (_vecs).
        # The stream mode (one DRAM read, reads and writes overlapping, its blocks waiting on small
        # work items) stays a move, with pieces of 32 KB of input. The measurements behind these
        # choices are in docs/benchmarks.md.
        segs = max(2, min(128, _pow2_ceil(cols * ITEMSIZE[m.info["tin"]] // (32 << 10))))
        online = {**base, "mode": "online", "tpr": 1024, "vec": vec, "segs": segs}
        ring = {**online, **self._ring(m, device)}
        if cols * ITEMSIZE[m.info["tin"]] >= 256 << 10 and self.valid(m, ring, backend, device):
            return ring
        return online

    def _ring(self, m: Match, device: DeviceProps) -> dict:
        """The ring's settings: 512 threads, two blocks an SM, clusters of 8, or of 16 where an
        eighth of a row does not fit a block's share of shared memory at two blocks an SM."""
        cl = 8 if ring_cap(ITEMSIZE[m.info["tin"]], 2, device) >= m.info["cols"] // 8 else 16
        return {"mode": "ring", "cl": cl, "bps": 2, "tpr": 512, "load": "bulk"}

    def mode_settings(self, m: Match, mode: str, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """Settings for a move into a long-row mode: the online mode at 1024 threads a row, the
        cluster modes and stream at 512 (the stash and the cluster in clusters of 8, the stash at two
        blocks an SM), the ring as _ring."""
        if backend == "cpu":
            return {}
        if mode == "ring":
            return {k: v for k, v in self._ring(m, device).items() if k != "mode"}
        return {"online": {"tpr": 1024}, "stash": {"tpr": 512, "cl": 8, "bps": 2}, "stream": {"tpr": 512},
                "cluster": {"tpr": 512, "cl": 8}}.get(mode, {})

    def passes(self, m: Match, p: dict) -> int:
        return 1 if p.get("mode", "regs") in ("regs", "cluster", "stash", "stream", "ring") and "chunk" not in p else 2

    def relevant(self, p: dict) -> dict:
        """The parameters that change the kernel (segments only split and stream, order only split,
        ahead only stream, rows per block only regs, cluster size only the cluster modes, blocks per
        SM only stash and ring)."""
        q = dict(p)
        if q.get("mode") not in ("split", "stream"):
            q.pop("segs", None)
        if q.get("mode") != "split":
            q.pop("order", None)
        if q.get("mode") != "stream":
            q.pop("ahead", None)
        if q.get("mode") != "regs":
            q.pop("rpb", None)
        if q.get("mode") not in ("cluster", "stash", "ring"):
            q.pop("cl", None)
        if q.get("mode") not in ("stash", "ring"):
            q.pop("bps", None)
        if q.get("mode") != "ring":
            q.pop("load", None)
        return q

    # ---- rendering -------------------------------------------------------------------------------
    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        head = header(self.name, p, self.passes(m, p))
        if backend == "cpu":
            return head + self._cpu(m, p)
        return head + self._cuda(m, p, device)

    def _cpu(self, m: Match, p: dict) -> str:
        log = m.info["log"]
        return CPU_COMMON + CPP.section("exp") + _xrow_macro(_xrows(m)) + CPP.fill(
            "entry", ti=CPU_CTYPE[m.info["tin"]], to=CPU_CTYPE[m.info["tout"]], rows=m.info["rows"], cols=m.info["cols"],
            x_check=_x_check(m), chunk=p["chunk"],
            scale="const float ls = (float)std::log(s);" if log else "const float inv = (float)(1.0 / s);",
            write="xv - m - ls" if log else "exp_le0(xv - m) * inv")

    def _cuda(self, m: Match, p: dict, device: DeviceProps) -> str:
        rows, cols, log = m.info["rows"], m.info["cols"], "true" if m.info["log"] else "false"
        tpr, rpb, vec, segs = p["tpr"], p["rpb"], p["vec"], p["segs"]
        mode = p["mode"]
        if mode == "regs":
            launch = CU.inline("regs", tpr=tpr, rpb=rpb, vec=vec, nv=-(-cols // (tpr * vec)), nv1=-(-cols // tpr),
                               log=log, blocks=-(-rows // rpb), threads=tpr * rpb)
        elif mode == "online":
            launch = CU.inline("online", tpr=tpr, vec=vec, log=log)
        elif mode == "cluster":
            cl = p["cl"]
            seg = cols // cl
            launch = CU.inline("cluster", cl=cl, tpr=tpr, vec=vec, nv=-(-seg // (tpr * vec)), nv1=-(-seg // tpr), log=log)
        elif mode == "stream":
            launch = CU.inline("stream", counters=stream_counters("ROWS"), ahead=p["ahead"], segs=segs, tpr=tpr, vec=vec,
                               piece=cols // segs, log=log, grid=device.sms * max(1, 1024 // tpr))
        elif mode == "stash":
            cl, smem = p["cl"], stash_bytes(p["bps"], device)
            stash = min(cols // cl, smem // ITEMSIZE[m.info["tin"]]) // vec * vec
            launch = CU.inline("stash", cl=cl, tpr=tpr, vec=vec, log=log, smem=smem, stash=stash)
        elif mode == "ring":
            cl = p["cl"]
            stash = ring_stash(cols // cl, ITEMSIZE[m.info["tin"]], tpr * vec, p["bps"], device)
            smem = stash * ITEMSIZE[m.info["tin"]]
            bulk = "true" if p.get("load", "bulk") == "bulk" else "false"
            k_vec = CU.inline("ring_kernel", cl=cl, tpr=tpr, vec=vec, log=log, bulk=bulk)
            k_one = CU.inline("ring_kernel", cl=cl, tpr=tpr, vec=1, log=log, bulk="false")
            args = CU.inline("ring_args", stash=stash)
            launch = CU.inline("ring", launch_vec=ring_launch(k_vec, "ROWS", cl, tpr, smem, args),
                               launch_one=ring_launch(k_one, "ROWS", cl, tpr, smem, args))
        else:
            seg_len = -(-cols // segs)
            seg_len = -(-seg_len // vec) * vec
            rev = "true" if p.get("order", "reverse") == "reverse" else "false"
            launch = CU.inline("split", tpr=tpr, vec=vec, segs=segs, seg_len=seg_len, log=log, rev=rev)
        if mode == "split":
            opening = CU.inline("open_split", rows=rows, segs=segs, entry=workspace_entry("WS_BYTES"))
        elif mode == "stream":  # per piece (max, sum); a finished-pieces count per row; the ticket
            opening = CU.inline("open_stream", entry=workspace_entry("WS_BYTES"),
                                ws_bytes=stream_ws_bytes(f"(int64_t)sizeof(float2) * {rows} * {segs}", str(rows)))
        else:
            opening = CU.inline("open")
        return CUDA_COMMON + _xrow_macro(_xrows(m)) + CUH.section("kernels") + CU.fill(
            "entry", ti=CTYPE[m.info["tin"]], to=CTYPE[m.info["tout"]], rows=rows, cols=cols, opening=opening,
            x_check=_x_check(m), vec=vec, launch=launch)
