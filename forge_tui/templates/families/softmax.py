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
"""

from __future__ import annotations

from ...cards import Card
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.launch import ring_launch, stream_counters, stream_ws_bytes, workspace_entry
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
        return f"#define XROW(r) ((int64_t)(r) * {xrows[0][1]}LL)\n"
    (_, s0), (n1, s1) = xrows
    return f"#define XROW(r) ((int64_t)(r) / {n1} * {s0}LL + (int64_t)(r) % {n1} * {s1}LL)\n"


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
        if card.kind in ("module", "chain"):
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
        ti, to = CPU_CTYPE[m.info["tin"]], CPU_CTYPE[m.info["tout"]]
        rows, cols, log = m.info["rows"], m.info["cols"], m.info["log"]
        write = "xv - m - ls" if log else "exp_le0(xv - m) * inv"
        return CPU_COMMON + CPU_EXP + _xrow_macro(_xrows(m)) + f'''
typedef {ti} TI;
typedef {to} TO;
static const int64_t ROWS = {rows}, COLS = {cols};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (n_in != 1 || n_out != 1 || forge_numel(&in[0]) != ROWS * COLS || {_x_check(m)}
        || !forge_is_contiguous(&out[0])) return 2;
    const TI* x = (const TI*)in[0].data;
    TO* y = (TO*)out[0].data;
#pragma omp parallel for schedule(static, {p["chunk"]}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {{
        const TI* a = x + XROW(r);
        TO* o = y + r * COLS;
        float m = -INFINITY;
        bool nan = false;
#pragma omp simd reduction(max:m) reduction(||:nan)
        for (int64_t c = 0; c < COLS; ++c) {{ const float v = to_f(a[c]); m = std::max(m, v); nan = nan || v != v; }}
        if (nan || m == -INFINITY) m = NAN;  /* eager: a NaN anywhere, or a row of -inf, gives a row of NaN */
        double s = 0.0;  /* many small terms after a large one: a float sum would drift */
#pragma omp simd reduction(+:s)
        for (int64_t c = 0; c < COLS; ++c) s += exp_le0(to_f(a[c]) - m);
        {"const float ls = (float)std::log(s);" if log else "const float inv = (float)(1.0 / s);"}
#pragma omp simd
        for (int64_t c = 0; c < COLS; ++c) {{ const float xv = to_f(a[c]); o[c] = from_f<TO>({write}); }}
    }}
    return 0;
}}
'''

    def _cuda(self, m: Match, p: dict, device: DeviceProps) -> str:
        ti, to = CTYPE[m.info["tin"]], CTYPE[m.info["tout"]]
        rows, cols, log = m.info["rows"], m.info["cols"], "true" if m.info["log"] else "false"
        tpr, rpb, vec, segs = p["tpr"], p["rpb"], p["vec"], p["segs"]
        mode = p["mode"]
        body = KERNELS
        if mode == "regs":
            nv = -(-cols // (tpr * vec))
            nv1 = -(-cols // tpr)
            blocks = -(-rows // rpb)
            launch = f'''
    if (aligned) softmax_regs<TI, TO, {tpr}, {rpb}, {vec}, {nv}, {log}><<<{blocks}, {tpr * rpb}, 0, s>>>(x, y, ROWS, COLS);
    else softmax_regs<TI, TO, {tpr}, {rpb}, 1, {nv1}, {log}><<<{blocks}, {tpr * rpb}, 0, s>>>(x, y, ROWS, COLS);'''
        elif mode == "online":
            launch = f'''
    if (aligned) softmax_online<TI, TO, {tpr}, {vec}, {log}><<<ROWS, {tpr}, 0, s>>>(x, y, COLS);
    else softmax_online<TI, TO, {tpr}, 1, {log}><<<ROWS, {tpr}, 0, s>>>(x, y, COLS);'''
        elif mode == "cluster":
            cl = p["cl"]
            seg = cols // cl
            nv = -(-seg // (tpr * vec))
            nv1 = -(-seg // tpr)
            launch = f'''
    if (aligned) softmax_cluster<TI, TO, {cl}, {tpr}, {vec}, {nv}, {log}><<<ROWS * {cl}, {tpr}, 0, s>>>(x, y, COLS);
    else softmax_cluster<TI, TO, {cl}, {tpr}, 1, {nv1}, {log}><<<ROWS * {cl}, {tpr}, 0, s>>>(x, y, COLS);'''
        elif mode == "stream":
            ahead = p["ahead"]
            piece = cols // segs
            grid = device.sms * max(1, 1024 // tpr)
            launch = f'''
    if (ws_bytes < WS_BYTES) return 4;
    float2* part = (float2*)workspace;
{stream_counters("ROWS")}    const unsigned items = (unsigned)((ROWS + {ahead}) * {segs} * 2);
    if (aligned) softmax_stream<TI, TO, {tpr}, {vec}, {segs}, {piece}, {ahead}, {log}><<<{grid}, {tpr}, 0, s>>>(x, y, part, done, ticket, (int)ROWS, items);
    else softmax_stream<TI, TO, {tpr}, 1, {segs}, {piece}, {ahead}, {log}><<<{grid}, {tpr}, 0, s>>>(x, y, part, done, ticket, (int)ROWS, items);'''
        elif mode == "stash":
            cl, smem = p["cl"], stash_bytes(p["bps"], device)
            stash = min(cols // cl, smem // ITEMSIZE[m.info["tin"]]) // vec * vec
            k_vec = f"softmax_stash<TI, TO, {cl}, {tpr}, {vec}, {log}>"
            k_one = f"softmax_stash<TI, TO, {cl}, {tpr}, 1, {log}>"
            launch = f'''
    /* more than 48 KB of dynamic shared memory is opt-in, per kernel (set on every call: no state) */
    if (aligned) {{
        cudaFuncSetAttribute({k_vec}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});
        {k_vec}<<<ROWS * {cl}, {tpr}, {smem}, s>>>(x, y, COLS, {stash});
    }} else {{
        cudaFuncSetAttribute({k_one}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});
        {k_one}<<<ROWS * {cl}, {tpr}, {smem}, s>>>(x, y, COLS, {stash});
    }}'''
        elif mode == "ring":
            cl = p["cl"]
            stash = ring_stash(cols // cl, ITEMSIZE[m.info["tin"]], tpr * vec, p["bps"], device)
            smem = stash * ITEMSIZE[m.info["tin"]]
            bulk = "true" if p.get("load", "bulk") == "bulk" else "false"
            k_vec = f"softmax_ring<TI, TO, {cl}, {tpr}, {vec}, {log}, {bulk}>"
            k_one = f"softmax_ring<TI, TO, {cl}, {tpr}, 1, {log}, false>"
            args = f"x, y, COLS, {stash}, (int)ROWS"
            launch = f"""
    if (aligned && forge_aligned(x, 16))  /* bulk copies start on 16-byte boundaries */
{ring_launch(k_vec, "ROWS", cl, tpr, smem, args)}    else
{ring_launch(k_one, "ROWS", cl, tpr, smem, args)}"""
        else:
            seg_len = -(-cols // segs)
            seg_len = -(-seg_len // vec) * vec
            rev = "true" if p.get("order", "reverse") == "reverse" else "false"
            launch = f'''
    if (ws_bytes < WS_BYTES) return 4;
    float2* ws = (float2*)workspace;
    if (aligned) {{
        softmax_split_stats<TI, {tpr}, {vec}><<<ROWS * {segs}, {tpr}, 0, s>>>(x, ws, COLS, {segs}, {seg_len});
        softmax_split_write<TI, TO, {tpr}, {vec}, {log}, {rev}><<<ROWS * {segs}, {tpr}, 0, s>>>(x, y, ws, COLS, {segs}, {seg_len});
    }} else {{
        softmax_split_stats<TI, {tpr}, 1><<<ROWS * {segs}, {tpr}, 0, s>>>(x, ws, COLS, {segs}, {seg_len});
        softmax_split_write<TI, TO, {tpr}, 1, {log}, {rev}><<<ROWS * {segs}, {tpr}, 0, s>>>(x, y, ws, COLS, {segs}, {seg_len});
    }}'''
        if mode == "split":
            entry = (f"static const int64_t WS_BYTES = (int64_t)sizeof(float2) * {rows} * {segs};\n\n"
                     + workspace_entry("WS_BYTES"))
        elif mode == "stream":  # per piece (max, sum); a finished-pieces count per row; the ticket
            entry = (stream_ws_bytes(f"(int64_t)sizeof(float2) * {rows} * {segs}", str(rows)) + "\n"
                     + workspace_entry("WS_BYTES"))
        else:
            entry = '''FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {'''
        return CUDA_COMMON + _xrow_macro(_xrows(m)) + body + f'''
typedef {ti} TI;
typedef {to} TO;
static const int64_t ROWS = {rows};
static const int COLS = {cols};

{entry}
    if (n_in != 1 || n_out != 1 || forge_numel(&in[0]) != ROWS * COLS || {_x_check(m)}
        || !forge_is_contiguous(&out[0])) return 2;
    const TI* x = (const TI*)in[0].data;
    TO* y = (TO*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    const bool aligned = forge_aligned(x, {vec} * sizeof(TI)) && forge_aligned(y, {vec} * sizeof(TO));
{launch}
    return (int)cudaGetLastError();
}}
'''


CPU_EXP = r'''
/* e^x for x <= 0, without branches so that the compiler vectorises it (given the cpu builder's
   -fno-trapping-math): Cody-Waite reduction to r in [-ln2/2, ln2/2], Cephes' single-precision
   polynomial (within 2 ulp), scaled by 2^n through the exponent bits. 0 below -87.3 (where e^x
   leaves the normal floats; -inf included); NaN stays NaN. */
static inline float exp_le0(float x) {
    const bool live = x >= -87.3f;
    const float xs = live ? x : -87.3f;
    const float n = std::floor(xs * 1.44269504088896341f + 0.5f);
    const float r = (xs - n * 0.693359375f) + n * 2.12194440e-4f;
    float q = 1.9875691500e-4f;
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    const float e = q * r * r + r + 1.f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    const float z = live ? e * scale : 0.f;
    return x != x ? x : z;
}
'''


KERNELS = r'''
#include <cooperative_groups.h>
/* One pass: TPR threads own a row, each holding NV vectors of VEC elements in registers. */
template <typename TI, typename TO, int TPR, int RPB, int VEC, int NV, bool LOG>
__global__ void __launch_bounds__(TPR * RPB) softmax_regs(const TI* __restrict__ x, TO* __restrict__ y,
                                                          int64_t rows, int cols) {
    __shared__ float scratch[RPB * (TPR >= 32 ? TPR / 32 : 1)];
    const int64_t row = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    const bool live = row < rows;
    const TI* xr = x + XROW(live ? row : 0);
    TO* yr = y + (live ? row : 0) * (int64_t)cols;
    float v[NV][VEC];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
            load_vec<TI, VEC>(xr + c, v[k]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) m = fmaxf(m, v[k][j]);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[k][j] = -INFINITY;
        }
    }
    m = row_reduce<TPR, true>(m, scratch);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) s += __expf(v[k][j] - m);
        }
    }
    s = row_reduce<TPR, false>(s, scratch);
    const float inv = 1.f / s, ls = logf(s);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
            float o[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[k][j] - m - ls) : __expf(v[k][j] - m) * inv;
            store_vec<TO, VEC>(yr + c, o);
        }
    }
}

/* Running (max, sum) merged across threads. A -inf partial contributes nothing; a NaN partial (a
   NaN seen in the row) makes the merge NaN: eager's softmax of a row holding a NaN is all NaN, and
   the "nothing seen yet" -inf would otherwise drop it. */
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) { m = s = NAN; return; }
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) { m = m2; s = s2; return; }
    const float M = fmaxf(m, m2);
    s = s * __expf(m - M) + s2 * __expf(m2 - M);
    m = M;
}

template <int VEC>
__device__ __forceinline__ void ms_add(float& m, float& s, const float (&v)[VEC]) {
    if (m != m) return;  /* a NaN seen: the row's result is NaN whatever follows */
    float vm = v[0];
    bool nan = v[0] != v[0];
#pragma unroll
    for (int j = 1; j < VEC; ++j) { vm = fmaxf(vm, v[j]); nan |= v[j] != v[j]; }
    if (nan) { m = s = NAN; return; }
    if (vm == -INFINITY) return;
    if (vm > m) { s = (m == -INFINITY) ? 0.f : s * __expf(m - vm); m = vm; }
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += __expf(v[j] - m);
}

template <int THREADS>
__device__ __forceinline__ void block_ms(float& m, float& s) {
    __shared__ float sm[32], ss[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    if constexpr (THREADS > 32) {
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) { sm[w] = m; ss[w] = s; }
        __syncthreads();
        m = lane < THREADS / 32 ? sm[lane] : -INFINITY;
        s = lane < THREADS / 32 ? ss[lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

/* Two passes in one block per row: running max and sum, then the write. */
template <typename TI, typename TO, int THREADS, int VEC, bool LOG>
__global__ void __launch_bounds__(THREADS) softmax_online(const TI* __restrict__ x, TO* __restrict__ y, int cols) {
    const TI* xr = x + XROW(blockIdx.x);
    TO* yr = y + (int64_t)blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    for (int c = threadIdx.x * VEC; c < cols; c += THREADS * VEC) {
        float v[VEC];
        load_vec<TI, VEC>(xr + c, v);
        ms_add<VEC>(m, s, v);
    }
    block_ms<THREADS>(m, s);
    if (m == -INFINITY) s = NAN;  /* a row of -inf: eager gives NaN */
    const float inv = 1.f / s, ls = logf(s);
    for (int c = threadIdx.x * VEC; c < cols; c += THREADS * VEC) {
        float v[VEC], o[VEC];
        load_vec<TI, VEC>(xr + c, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[j] - m - ls) : __expf(v[j] - m) * inv;
        store_vec<TO, VEC>(yr + c, o);
    }
}

/* Split rows: partial (max, sum) per segment, then merge and write per segment. */
template <typename TI, int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) softmax_split_stats(const TI* __restrict__ x, float2* __restrict__ ws,
                                                               int cols, int segs, int seg_len) {
    const int64_t row = blockIdx.x / segs;
    const int seg = blockIdx.x % segs;
    const TI* xr = x + XROW(row);
    const int c0 = seg * seg_len, c1 = min(cols, c0 + seg_len);
    float m = -INFINITY, s = 0.f;
#pragma unroll 4
    for (int c = c0 + threadIdx.x * VEC; c < c1; c += THREADS * VEC) {
        float v[VEC];
        load_vec<TI, VEC>(xr + c, v);
        ms_add<VEC>(m, s, v);
    }
    block_ms<THREADS>(m, s);
    if (threadIdx.x == 0) ws[blockIdx.x] = make_float2(m, s);
}

template <typename TI, typename TO, int THREADS, int VEC, bool LOG, bool REVERSE>
__global__ void __launch_bounds__(THREADS) softmax_split_write(const TI* __restrict__ x, TO* __restrict__ y,
                                                               const float2* __restrict__ ws, int cols, int segs,
                                                               int seg_len) {
    const int64_t b = REVERSE ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int64_t row = b / segs;
    const int seg = (int)(b % segs);
    /* warp 0 merges the row's partials, a lane per partial (a serial loop over them would wait on
       one load at a time), and hands the result to the block */
    __shared__ float2 merged;
    if (threadIdx.x < 32) {
        float m = -INFINITY, s = 0.f;
        for (int k = threadIdx.x; k < segs; k += 32) {
            const float2 p = ws[row * segs + k];
            ms_merge(m, s, p.x, p.y);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
        if (threadIdx.x == 0) merged = make_float2(m, s);
    }
    __syncthreads();
    const float m = merged.x;
    float s = merged.y;
    if (m == -INFINITY) s = NAN;
    const float inv = 1.f / s, ls = logf(s);
    const TI* xr = x + XROW(row);
    TO* yr = y + row * cols;
    const int c0 = seg * seg_len, c1 = min(cols, c0 + seg_len);
    for (int c = c0 + threadIdx.x * VEC; c < c1; c += THREADS * VEC) {
        float v[VEC], o[VEC];
        load_vec<TI, VEC>(xr + c, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[j] - m - ls) : __expf(v[j] - m) * inv;
        store_vec<TO, VEC>(yr + c, o);
    }
}

/* One pass over rows too long for one block: a cluster of CL blocks per row, each holding its
   COLS/CL columns in registers; partial max, then partial sums, meet in distributed shared memory. */
template <typename TI, typename TO, int CL, int THREADS, int VEC, int NV, bool LOG>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS)
softmax_cluster(const TI* __restrict__ x, TO* __restrict__ y, int cols) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float scratch[THREADS >= 32 ? THREADS / 32 : 1];
    __shared__ float part[2];
    const int rank = (int)cluster.block_rank();
    const int64_t row = blockIdx.x / CL;
    const int seg = cols / CL;
    const TI* xr = x + XROW(row) + (int64_t)rank * seg;
    TO* yr = y + row * (int64_t)cols + (int64_t)rank * seg;
    const int t = threadIdx.x;
    float v[NV][VEC];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c < seg) {
            load_vec<TI, VEC>(xr + c, v[k]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) m = fmaxf(m, v[k][j]);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[k][j] = -INFINITY;
        }
    }
    m = row_reduce<THREADS, true>(m, scratch);
    if (t == 0) part[0] = m;
    cluster.sync();
    m = -INFINITY;
#pragma unroll
    for (int r = 0; r < CL; ++r) m = fmaxf(m, *cluster.map_shared_rank(&part[0], r));
    float s = 0.f;
    if (m != -INFINITY) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int j = 0; j < VEC; ++j) s += __expf(v[k][j] - m);
    }
    s = row_reduce<THREADS, false>(s, scratch);
    if (t == 0) part[1] = s;
    cluster.sync();
    s = 0.f;
#pragma unroll
    for (int r = 0; r < CL; ++r) s += *cluster.map_shared_rank(&part[1], r);
    cluster.sync();  /* no block leaves while another may still read its shared memory */
    if (m == -INFINITY) s = NAN;  /* a row of -inf: eager gives NaN */
    const float inv = 1.f / s, ls = logf(s);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c < seg) {
            float o[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[k][j] - m - ls) : __expf(v[k][j] - m) * inv;
            store_vec<TO, VEC>(yr + c, o);
        }
    }
}

/* One DRAM read of a long row: a cluster of CL blocks per row, block `rank` owning the segment
   [rank * seg, (rank + 1) * seg). Pass A streams the segment, keeping its first `stash` elements
   in shared memory, with a running (max, sum) per thread; the block's partial goes to the cluster
   through distributed shared memory. Pass B writes from the stash (the rest re-read, from L2). */
template <typename TI, typename TO, int CL, int THREADS, int VEC, bool LOG>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS)
softmax_stash(const TI* __restrict__ x, TO* __restrict__ y, int cols, int stash) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    extern __shared__ __align__(16) unsigned char stash_raw[];
    TI* keep = reinterpret_cast<TI*>(stash_raw);
    __shared__ float2 part;
    __shared__ float2 merged;
    const int rank = (int)cluster.block_rank();
    const int64_t row = blockIdx.x / CL;
    const int seg = cols / CL;
    const TI* xr = x + XROW(row) + (int64_t)rank * seg;
    TO* yr = y + row * (int64_t)cols + (int64_t)rank * seg;
    float m = -INFINITY, s = 0.f;
#pragma unroll 4
    for (int c = threadIdx.x * VEC; c < seg; c += THREADS * VEC) {
        const Vec<TI, VEC> raw = *reinterpret_cast<const Vec<TI, VEC>*>(xr + c);
        if (c < stash) *reinterpret_cast<Vec<TI, VEC>*>(keep + c) = raw;
        float v[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = to_f(raw.v[j]);
        ms_add<VEC>(m, s, v);
    }
    block_ms<THREADS>(m, s);
    if (threadIdx.x == 0) part = make_float2(m, s);
    cluster.sync();
    if (threadIdx.x < 32) {
        m = -INFINITY;
        s = 0.f;
        if (threadIdx.x < CL) {
            const float2 q = *cluster.map_shared_rank(&part, (int)threadIdx.x);
            m = q.x;
            s = q.y;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
        if (threadIdx.x == 0) merged = make_float2(m, s);
    }
    __syncthreads();
    m = merged.x;
    s = merged.y;
    if (m == -INFINITY) s = NAN;  /* a row of -inf: eager gives NaN */
    const float inv = 1.f / s, ls = logf(s);
#pragma unroll 4
    for (int c = threadIdx.x * VEC; c < seg; c += THREADS * VEC) {
        const Vec<TI, VEC> raw = c < stash ? *reinterpret_cast<const Vec<TI, VEC>*>(keep + c)
                                           : *reinterpret_cast<const Vec<TI, VEC>*>(xr + c);
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const float v = to_f(raw.v[j]);
            o[j] = LOG ? (v - m - ls) : __expf(v - m) * inv;
        }
        store_vec<TO, VEC>(yr + c, o);
    }
    cluster.sync();  /* no block leaves while another may still read its shared memory */
}

/* One DRAM read, persistent: the cluster of CL blocks numbered cid walks rows cid, cid + clusters,
   ...; block `rank` owns segment [rank * seg, (rank + 1) * seg) of each and keeps its first
   `stash` elements in shared memory, in chunks of one vector per thread (thread t's element of
   chunk c: c * THREADS * VEC + t * VEC). BULK: one thread loads each chunk with a bulk copy
   counted on the chunk's mbarrier, and the statistics of a chunk start as soon as it lands; once
   the block has written its chunks (the stores drain while the loads run), a barrier, then the
   next row's chunks are requested. Otherwise (inputs not on 16-byte boundaries) each thread
   stages its own elements with cp.async as it writes them. The cluster's (max, sum) partials
   alternate between two buffers by round (a block can publish round r + 1 while another still
   reads round r, never r + 2: the cluster barrier waits for every block). Elements past the stash
   are read twice, the second time from L2. */
template <typename TI, typename TO, int CL, int THREADS, int VEC, bool LOG, bool BULK>
__global__ void __launch_bounds__(THREADS)
softmax_ring(const TI* __restrict__ x, TO* __restrict__ y, int cols, int stash, int rows) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    constexpr int CE = THREADS * VEC;  /* elements a chunk */
    extern __shared__ __align__(16) unsigned char stash_raw[];
    TI* keep = reinterpret_cast<TI*>(stash_raw);
    __shared__ __align__(8) uint64_t bar[BULK ? RING_MAX_CHUNKS : 1];
    __shared__ float2 part[2];
    __shared__ float2 merged;
    const int rank = (int)cluster.block_rank();
    const int clusters = (int)(gridDim.x / CL), cid = (int)(blockIdx.x / CL);
    const int seg = cols / CL, nc = stash / CE;
    const int64_t seg0 = (int64_t)rank * seg;
    const int t = threadIdx.x;
    ring_start<TI, VEC, CE, BULK>(keep, bar, x + XROW(cid) + seg0, nc, stash, cid < rows);
    int round = 0;
    for (int row = cid; row < rows; row += clusters, round ^= 1) {
        const TI* xr = x + XROW(row) + seg0;
        TO* yr = y + (int64_t)row * cols + seg0;
        float m = -INFINITY, s = 0.f;
        if constexpr (!BULK) stage_wait();
        for (int c = 0; c < nc; ++c) {
            if constexpr (BULK) bulk_wait(&bar[c], (unsigned)round);
            const Vec<TI, VEC> raw = *reinterpret_cast<const Vec<TI, VEC>*>(keep + c * CE + t * VEC);
            float v[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = to_f(raw.v[j]);
            ms_add<VEC>(m, s, v);
        }
        for (int c = stash + t * VEC; c < seg; c += CE) {
            float v[VEC];
            load_vec<TI, VEC>(xr + c, v);
            ms_add<VEC>(m, s, v);
        }
        block_ms<THREADS>(m, s);
        if (t == 0) part[round] = make_float2(m, s);
        cluster.sync();
        if (t < 32) {
            m = -INFINITY;
            s = 0.f;
            if (t < CL) {
                const float2 q = *cluster.map_shared_rank(&part[round], t);
                m = q.x;
                s = q.y;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
                ms_merge(m, s, m2, s2);
            }
            if (t == 0) merged = make_float2(m, s);
        }
        __syncthreads();
        m = merged.x;
        s = merged.y;
        if (m == -INFINITY) s = NAN;  /* a row of -inf: eager gives NaN */
        const float inv = 1.f / s, ls = logf(s);
        const int next = row + clusters;
        const TI* xn = x + XROW(next) + seg0;  /* dereferenced only when next < rows */
#pragma unroll 4
        for (int c = t * VEC; c < stash; c += CE) {
            const Vec<TI, VEC> raw = *reinterpret_cast<const Vec<TI, VEC>*>(keep + c);
            float o[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const float v = to_f(raw.v[j]);
                o[j] = LOG ? (v - m - ls) : __expf(v - m) * inv;
            }
            store_vec<TO, VEC>(yr + c, o);
            /* the store above consumed the element's value: its read is complete before the
               element is overwritten */
            if constexpr (!BULK) { if (next < rows) stage_vec<TI, VEC>(keep + c, xn + c); }
        }
        ring_refill<TI, CE, BULK>(keep, bar, xn, nc, next < rows);
        for (int c = stash + t * VEC; c < seg; c += CE) {
            float v[VEC], o[VEC];
            load_vec<TI, VEC>(xr + c, v);
#pragma unroll
            for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[j] - m - ls) : __expf(v[j] - m) * inv;
            store_vec<TO, VEC>(yr + c, o);
        }
    }
    cluster.sync();  /* no block leaves while another may still read its shared memory */
}

/* Ordered work items (decode_item in the common code): units are rows, the second phase writes
   a piece AHEAD rows after its statistics. */
template <typename TI, typename TO, int THREADS, int VEC, int SEGS, int PIECE, int AHEAD, bool LOG>
__global__ void __launch_bounds__(THREADS)
softmax_stream(const TI* __restrict__ x, TO* __restrict__ y, float2* __restrict__ part, unsigned* done,
               unsigned* ticket, int rows, unsigned items) {
    __shared__ unsigned s_item[2];
    __shared__ float2 merged;
    const int t = threadIdx.x;
    /* the next item's ticket is taken while this one runs (its atomic's latency off the path) */
    if (t == 0) s_item[0] = atomicAdd(ticket, 1u);
    __syncthreads();
    for (int cur = 0;; cur ^= 1) {
        WorkItem wi;
        if (!take_item<SEGS, AHEAD>(s_item, cur, ticket, items, rows, wi)) return;
        const int row = wi.unit, piece = wi.piece;
        const bool stats = wi.stats;
        if (row < 0) {
            __syncthreads();  /* the next ticket is in s_item[cur ^ 1] for everyone */
            continue;
        }
        const TI* xr = x + XROW(row) + (int64_t)piece * PIECE;
        if (stats) {
            float m = -INFINITY, s = 0.f;
#pragma unroll 4
            for (int c = t * VEC; c < PIECE; c += THREADS * VEC) {
                float v[VEC];
                load_vec<TI, VEC>(xr + c, v);
                ms_add<VEC>(m, s, v);
            }
            block_ms<THREADS>(m, s);
            if (t == 0) {
                part[(int64_t)row * SEGS + piece] = make_float2(m, s);
                count_piece(done + row);
            }
            __syncthreads();
        } else {
            if (t == 0) wait_pieces(done + row, SEGS);
            __syncthreads();
            if (t < 32) {
                float m = -INFINITY, s = 0.f;
                for (int k = t; k < SEGS; k += 32) {
                    const float2 q = __ldcg(part + (int64_t)row * SEGS + k);
                    ms_merge(m, s, q.x, q.y);
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
                    ms_merge(m, s, m2, s2);
                }
                if (t == 0) merged = make_float2(m, s);
            }
            __syncthreads();
            const float m = merged.x;
            float s = merged.y;
            if (m == -INFINITY) s = NAN;  /* a row of -inf: eager gives NaN */
            const float inv = 1.f / s, ls = logf(s);
            TO* yr = y + (int64_t)row * (SEGS * PIECE) + (int64_t)piece * PIECE;
#pragma unroll 4
            for (int c = t * VEC; c < PIECE; c += THREADS * VEC) {
                float v[VEC], o[VEC];
                load_vec<TI, VEC>(xr + c, v);
#pragma unroll
                for (int j = 0; j < VEC; ++j) o[j] = LOG ? (v[j] - m - ls) : __expf(v[j] - m) * inv;
                store_vec<TO, VEC>(yr + c, o);
            }
        }
    }
}
'''
