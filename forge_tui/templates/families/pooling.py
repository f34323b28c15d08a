"""Pooling: adaptive average pooling to 1x1 (``mean`` over the trailing dims, as eager lowers it,
or ``_adaptive_avg_pool2d``) and ``max_pool2d_with_indices`` (values and PyTorch's indices)."""

from __future__ import annotations

from ...cards import Card
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ..base import CTYPE, FLOAT_DTYPES, input_index, numel


class MeanPool(Family):
    """Mean over the last k contiguous dims (rows x cols): global average pooling."""

    name = "avg_pool"

    def match(self, card: Card) -> Match | None:
        if card.kind != "op" or len(card.outputs) != 1:
            return None
        a = card.program["nodes"][0]["args"]
        kw = card.program["nodes"][0].get("kwargs", {})
        x = card.inputs[0] if card.inputs else None
        if x is None or x.dtype not in FLOAT_DTYPES or not x.contiguous or len(x.shape) < 2:
            return None
        nd = len(x.shape)
        if card.target == "aten.mean.dim":
            dims = a[1] if len(a) > 1 else None
            if not isinstance(dims, list) or not dims or kw.get("dtype") or (len(a) > 3 and a[3] is not None):
                return None
            dims = sorted(d % nd for d in dims)
            if dims != list(range(nd - len(dims), nd)):
                return None
            k = len(dims)
        elif card.target == "aten._adaptive_avg_pool2d.default":
            if a[1] != [1, 1] or nd not in (3, 4):
                return None
            k = 2
        else:
            return None
        cols = numel(x.shape[nd - k:])
        rows = numel(x.shape[:nd - k])
        if card.outputs[0].dtype not in FLOAT_DTYPES or rows == 0 or cols == 0:
            return None
        return Match(self.name, card, {"rows": rows, "cols": cols, "tin": x.dtype, "tout": card.outputs[0].dtype})

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [16, 64, 256]}
        return {"mode": ["tile", "vtile", "warp"], "threads": [64, 128, 256, 512]}

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        if p["mode"] == "tile":
            return m.info["cols"] * p["threads"] * 4 <= 48 * 1024
        if p["mode"] == "vtile":
            span = m.info["cols"] * p["threads"] * ITEMSIZE[m.info["tin"]]
            return span % 16 == 0 and span <= 48 * 1024
        return True

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 64}
        if m.info["cols"] <= 96:
            # 16-byte loads all in flight at once where the block's span allows them: faster than
            # the element-wise tile on short rows such as ResNet's 7x7 (docs/benchmarks.md)
            vt = {"mode": "vtile", "threads": 128}
            if self.valid(m, vt, backend):
                return vt
            return {"mode": "tile", "threads": 128 if m.info["cols"] * 128 * 4 <= 48 * 1024 else 64}
        return {"mode": "warp", "threads": 256}

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        if backend == "cpu":
            from ...kernels.common import CPU_COMMON as COMMON

            return header(self.name, p, 1) + COMMON + f'''
typedef {CPU_CTYPE[i["tin"]]} TX; typedef {CPU_CTYPE[i["tout"]]} TO;
static const int64_t ROWS = {i["rows"]}, COLS = {i["cols"]};
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[0]) != ROWS * COLS) return 2;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
#pragma omp parallel for schedule(static, {p["chunk"]}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {{
        float s = 0.f;
        for (int64_t c = 0; c < COLS; ++c) s += to_f(x[r * COLS + c]);
        y[r] = from_f<TO>(s / (float)COLS);
    }}
    return 0;
}}
'''
        from ...kernels.common import CUDA_COMMON as COMMON

        threads = p["threads"]
        if p["mode"] == "tile":
            blocks = -(-i["rows"] // threads)
            launch = f"mean_tile<TX, TO, {threads}, {i['cols']}><<<{blocks}, {threads}, 0, s>>>(x, y, ROWS, COLS);"
        elif p["mode"] == "vtile":
            blocks = -(-i["rows"] // threads)
            launch = (f"if (forge_aligned(x, 16)) mean_vtile<TX, TO, {threads}, {i['cols']}, true><<<{blocks}, {threads}, 0, s>>>(x, y, ROWS);\n"
                      f"    else mean_vtile<TX, TO, {threads}, {i['cols']}, false><<<{blocks}, {threads}, 0, s>>>(x, y, ROWS);")
        else:
            rpb = threads // 32
            blocks = -(-i["rows"] // rpb)
            launch = f"mean_warp<TX, TO, {threads}><<<{blocks}, {threads}, 0, s>>>(x, y, ROWS, COLS);"
        return header(self.name, p, 1) + COMMON + MEAN_KERNELS + f'''
typedef {CTYPE[i["tin"]]} TX; typedef {CTYPE[i["tout"]]} TO;
static const int64_t ROWS = {i["rows"]};
static const int COLS = {i["cols"]};
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[0]) != ROWS * COLS) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
    {launch}
    return (int)cudaGetLastError();
}}
'''


MEAN_KERNELS = r'''
/* THREADS rows per block: the block's rows are one contiguous span, loaded coalesced into shared
   memory, then each thread sums its own row. For short rows (7x7 = 49 in ResNet's pooling). */
template <typename TX, typename TO, int THREADS, int COLS>
__global__ void __launch_bounds__(THREADS) mean_tile(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows, int cols) {
    __shared__ float tile[THREADS * COLS];
    const int64_t r0 = (int64_t)blockIdx.x * THREADS;
    const int64_t nrows = min((int64_t)THREADS, rows - r0);
    const int64_t span = nrows * cols;
    const TX* base = x + r0 * cols;
    for (int64_t k = threadIdx.x; k < span; k += THREADS) tile[k] = to_f(base[k]);
    __syncthreads();
    if (threadIdx.x < nrows) {
        float s = 0.f;
        for (int c = 0; c < cols; ++c) s += tile[threadIdx.x * cols + c];
        y[r0 + threadIdx.x] = from_f<TO>(s / (float)cols);
    }
}

/* As mean_tile, with the block's span (THREADS * COLS elements, a multiple of 16 bytes, from a
   16-byte aligned input) loaded in 16-byte vectors, every load of a thread issued before the first
   is stored: at a few MB the time is the latency of the loads, so all of them are in flight at
   once. The tile keeps the input type. A last block with fewer rows, or an input off 16-byte
   boundaries (VECLOAD false), loads element by element. */
template <typename TX, typename TO, int THREADS, int COLS, bool VECLOAD>
__global__ void __launch_bounds__(THREADS) mean_vtile(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows) {
    constexpr int SPAN = THREADS * COLS;
    constexpr int NV = (int)(SPAN * sizeof(TX) / 16);
    constexpr int LOADS = (NV + THREADS - 1) / THREADS;
    __shared__ __align__(16) TX tile[SPAN];
    const int64_t r0 = (int64_t)blockIdx.x * THREADS;
    const int nrows = (int)min((int64_t)THREADS, rows - r0);
    const TX* base = x + r0 * COLS;
    if (VECLOAD && nrows == THREADS) {
        const uint4* src = reinterpret_cast<const uint4*>(base);
        uint4 v[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = (int)threadIdx.x + k * THREADS;
            if (i < NV) v[k] = __ldg(src + i);
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = (int)threadIdx.x + k * THREADS;
            if (i < NV) reinterpret_cast<uint4*>(tile)[i] = v[k];
        }
    } else {
        for (int k = threadIdx.x; k < nrows * COLS; k += THREADS) tile[k] = base[k];
    }
    __syncthreads();
    if ((int)threadIdx.x < nrows) {
        float s = 0.f;
#pragma unroll 7
        for (int c = 0; c < COLS; ++c) s += to_f(tile[threadIdx.x * COLS + c]);
        y[r0 + threadIdx.x] = from_f<TO>(s / (float)COLS);
    }
}

/* One warp per row. */
template <typename TX, typename TO, int THREADS>
__global__ void __launch_bounds__(THREADS) mean_warp(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows, int cols) {
    const int64_t row = (int64_t)blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const TX* a = x + row * cols;
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += to_f(a[c]);
    s = warp_sum(s);
    if (lane == 0) y[row] = from_f<TO>(s / (float)cols);
}
'''


class MaxPool(Family):
    """max_pool2d: the op card (values and PyTorch's flat indices, both written) or the module card
    of an ``nn.MaxPool2d`` that returns the values alone (ResNet's stem), whose kernel skips the
    indices: for a 3x3/2 pool of fp16 they are 4x the bytes of the values.

    CUDA modes: ``thread`` (each thread reads its windows from global memory), ``tile`` (a block
    copies the input rows of ``rows`` output rows into shared memory with 16-byte loads, then
    computes from there) and ``strip`` (3-wide windows at stride 2 with padding 1, ResNet's pool:
    a thread takes OWV neighbouring outputs, loads the 2*OWV input columns under them in one
    vector per input row and gets the column to their left from its neighbour lane by a shuffle;
    no shared memory, no redundant loads)."""

    name = "max_pool"

    def match(self, card: Card) -> Match | None:
        nodes = card.program.get("nodes") or []
        if len(nodes) != 1 or nodes[0]["op"] != "aten.max_pool2d_with_indices.default":
            return None
        outs = card.program.get("outputs") or []
        if card.kind == "op" and len(card.outputs) == 2:
            with_idx = True
        elif card.kind == "module" and len(card.outputs) == 1 and outs == [{"$node": 0, "out": 0}]:
            with_idx = False
        else:
            return None
        a = nodes[0]["args"]
        x = card.inputs[input_index(a[0]) or 0]
        if x.dtype not in FLOAT_DTYPES or len(x.shape) != 4 or not x.contiguous or not card.outputs[0].contiguous:
            return None
        if with_idx and not card.outputs[1].contiguous:
            return None

        def pair(v, default):
            if v is None or v == []:
                return list(default)
            return [v[0], v[0]] if len(v) == 1 else list(v)

        k = pair(a[1], None)
        st = pair(a[2] if len(a) > 2 else None, k)
        pd = pair(a[3] if len(a) > 3 else None, [0, 0])
        dl = pair(a[4] if len(a) > 4 else None, [1, 1])
        if len(a) > 5 and a[5]:
            return None  # ceil_mode: windows past the edge; not templated
        n, c, h, w = x.shape
        oh, ow = card.outputs[0].shape[2:]
        return Match(self.name, card, {"n": n, "c": c, "h": h, "w": w, "oh": oh, "ow": ow, "k": k, "s": st,
                                       "p": pd, "d": dl, "tin": x.dtype, "tout": card.outputs[0].dtype,
                                       "idx": with_idx})

    # ---- the tile mode's geometry ----------------------------------------------------------------
    @staticmethod
    def _in_rows(i: dict, rows: int) -> int:
        """Input rows the windows of ``rows`` consecutive output rows touch (at most)."""
        return min(i["h"], (rows - 1) * i["s"][0] + (i["k"][0] - 1) * i["d"][0] + 1)

    def _tile_rows(self, i: dict) -> list[int]:
        """Output rows per block: powers of two below OH, and OH itself (a whole plane a block),
        where their input rows fit 48 KB of shared memory."""
        cand = sorted({r for r in (2, 4, 8, 16, 32) if r < i["oh"]} | {i["oh"]})
        size = ITEMSIZE[i["tin"]]
        return [r for r in cand if self._in_rows(i, r) * i["w"] * size <= 48 * 1024]

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16]}
        ax: dict[str, list] = {"mode": ["thread"], "threads": [128, 256, 512], "per_thread": [1, 2, 4], "owv": [1, 2, 4]}
        if any(self._strip_ok(m.info, v) for v in (2, 4)):
            ax["mode"].insert(0, "strip")
        rows = self._tile_rows(m.info)
        if rows:
            ax["mode"].append("tile")
            ax["rows"] = rows
        return ax

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        i = m.info
        if i["ow"] % p.get("owv", 1):
            return False
        if p.get("mode") == "tile":
            return p.get("rows") in self._tile_rows(i)
        if p.get("mode") == "strip":
            return self._strip_ok(i, p.get("owv", 1))
        return True

    @staticmethod
    def _strip_ok(i: dict, owv: int) -> bool:
        """The strip mode's columns: 3 wide, stride 2, padding 1, no dilation, OW = W / 2, and rows
        that split into whole 2*OWV-element vectors of at most 32 bytes."""
        return (owv in (2, 4) and i["k"][1] == 3 and i["s"][1] == 2 and i["p"][1] == 1 and i["d"][1] == 1
                and i["w"] == 2 * i["ow"] and i["w"] % (2 * owv) == 0 and 2 * owv * ITEMSIZE[i["tin"]] <= 32)

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 4}
        i = m.info
        # 16-byte loads: 4 outputs a thread for 2-byte types, 2 for fp32
        owv = 4 if ITEMSIZE[i["tin"]] == 2 else 2
        rows = self._tile_rows(i)
        if self._strip_ok(i, owv):
            return {"mode": "strip", "threads": 256, "per_thread": 1, "owv": owv, **({"rows": rows[-1]} if rows else {})}
        owv = 2 if i["ow"] % 2 == 0 else 1
        # Windows read from global memory (through L1) first: the shared-memory tile mode is
        # slower than the thread mode, on ResNet's pool and on a 2x2/2 pool (its blocks load their
        # rows, then compute, with nothing in flight; docs/benchmarks.md). The tile stays a move,
        # with a whole plane a block when there are planes enough to fill the GPU a few times
        # over, else the largest tile that still gives that many blocks.
        first = {"mode": "thread", "threads": 256, "per_thread": 1, "owv": owv}
        if not rows:
            return first
        planes = i["n"] * i["c"]
        enough = [r for r in rows if planes * -(-i["oh"] // r) >= 4 * device.sms]
        return {**first, "rows": max(enough) if enough else min(rows)}

    def relevant(self, p: dict) -> dict:
        """per_thread only applies to the thread mode with one output a thread; rows only to the tile mode."""
        q = dict(p)
        if q.get("owv", 1) > 1 or q.get("mode") in ("tile", "strip"):
            q.pop("per_thread", None)
        if q.get("mode") != "tile":
            q.pop("rows", None)
        return q

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        with_idx = i["idx"]
        consts = (f"static const int64_t NC = {i['n'] * i['c']}; static const int H = {i['h']}, W = {i['w']}, "
                  f"OH = {i['oh']}, OW = {i['ow']}, KH = {i['k'][0]}, KW = {i['k'][1]}, SH = {i['s'][0]}, "
                  f"SW = {i['s'][1]}, PH = {i['p'][0]}, PW = {i['p'][1]}, DH = {i['d'][0]}, DW = {i['d'][1]};")
        if backend == "cpu":
            return self._render_cpu(i, p, consts)
        from ...kernels.common import CUDA_COMMON as COMMON

        threads, owv = p["threads"], p.get("owv", 1)
        total = i["n"] * i["c"] * i["oh"] * i["ow"]
        idx_param = ", int64_t* __restrict__ idx" if with_idx else ""
        idx_arg = ", (int64_t*)out[1].data" if with_idx else ""
        guard = ""
        if owv > 1:
            guard += f"    if (!forge_aligned(out[0].data, {owv} * sizeof(TO))) return 5;\n"
            if with_idx:
                guard += "    if (!forge_aligned(out[1].data, 16)) return 5;\n"
        if p.get("mode") == "tile":
            rows = p["rows"]
            tiles = -(-i["oh"] // rows)
            blocks = i["n"] * i["c"] * tiles
            size = ITEMSIZE[i["tin"]]
            vec = 16 // size if (i["w"] * size) % 16 == 0 else 1
            if vec > 1:
                guard += "    if (!forge_aligned(in[0].data, 16)) return 5;\n"
            kernel = TILE_KERNEL
            consts += (f"\nconstexpr int ROWS = {rows}, IN_ROWS = {self._in_rows(i, rows)}, VEC = {vec}, "
                       f"TILES = {tiles};")
        elif p.get("mode") == "strip":
            blocks = -(-(total // owv) // threads)
            kernel = STRIP_KERNEL
            guard += f"    if (!forge_aligned(in[0].data, {2 * owv} * sizeof(TX))) return 5;\n"
        elif owv > 1:
            blocks = -(-(total // owv) // threads)
            kernel = OWV_KERNEL
        else:
            per = p["per_thread"]
            blocks = -(-total // (threads * per))
            kernel = THREAD_KERNEL
            consts += f"\nconstexpr int PER = {per};"
        kernel = kernel.replace("IDX_PARAM", idx_param).replace("IDX,", "idx," if with_idx else "nullptr,")
        return header(self.name, p, 1) + COMMON + f'''
typedef {CTYPE[i["tin"]]} TX; typedef {CTYPE[i["tout"]]} TO;
{consts}
constexpr int THREADS = {threads}, OWV = {owv};
static const int64_t TOTAL = {total};
{WINDOWS}{kernel}
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[0]) != NC * H * W) return 2;
{guard}    maxpool<<<{blocks}, {threads}, 0, (cudaStream_t)stream>>>((const TX*)in[0].data, (TO*)out[0].data{idx_arg});
    return (int)cudaGetLastError();
}}
'''

    def _render_cpu(self, i: dict, p: dict, consts: str) -> str:
        from ...kernels.common import CPU_COMMON as COMMON

        with_idx = i["idx"]
        return header(self.name, p, 1) + COMMON + f'''
typedef {CPU_CTYPE[i["tin"]]} TX; typedef {CPU_CTYPE[i["tout"]]} TO;
{consts}
using std::min;
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[0]) != NC * H * W) return 2;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
    {"int64_t* idx = (int64_t*)out[1].data;" if with_idx else ""}
#pragma omp parallel for schedule(static, {p["chunk"]}) if(NC * H * W >= PARALLEL_MIN)
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {{
        int hs = oh * SH - PH, ws = ow * SW - PW;
        const int he = min(hs + (KH - 1) * DH + 1, H), we = min(ws + (KW - 1) * DW + 1, W);
        while (hs < 0) hs += DH;
        while (ws < 0) ws += DW;
        float best = -INFINITY;
        int64_t bi = (int64_t)hs * W + ws;
        const TX* plane = x + nc * H * W;
        for (int ih = hs; ih < he; ih += DH)
            for (int iw = ws; iw < we; iw += DW) {{
                const float v = to_f(plane[ih * W + iw]);
                if (v > best || v != v) {{ best = v; bi = (int64_t)ih * W + iw; }}
            }}
        const int64_t o = (nc * OH + oh) * OW + ow;
        y[o] = from_f<TO>(best);
        {"idx[o] = bi;" if with_idx else "(void)bi;"}
    }}
    return 0;
}}
'''


# The windows of OWV neighbouring outputs of one output row, read from ``plane`` (global memory or a
# shared-memory tile whose first row is input row ``row0``): they share columns, loaded once each.
# NaN wins, and ties keep the first index, as PyTorch does.
WINDOWS = r'''
__device__ __forceinline__ void windows(const TX* plane, int row0, int oh, int ow0, float (&best)[OWV],
                                        int64_t (&bi)[OWV]) {
    int hs = oh * SH - PH;
    const int he = min(hs + (KH - 1) * DH + 1, H);
    while (hs < 0) hs += DH;
    int wsj[OWV], wej[OWV];
#pragma unroll
    for (int j = 0; j < OWV; ++j) {
        int w0 = (ow0 + j) * SW - PW;
        wej[j] = min(w0 + (KW - 1) * DW + 1, W);
        while (w0 < 0) w0 += DW;
        wsj[j] = w0;
        best[j] = -INFINITY;
        bi[j] = (int64_t)hs * W + w0;
    }
    for (int ih = hs; ih < he; ih += DH) {
        const TX* rowp = plane + (int64_t)(ih - row0) * W;
#pragma unroll
        for (int j = 0; j < OWV; ++j)
            for (int iw = wsj[j]; iw < wej[j]; iw += DW) {
                const float v = to_f(rowp[iw]);
                if (v > best[j] || v != v) { best[j] = v; bi[j] = (int64_t)ih * W + iw; }
            }
    }
}

/* The values leave as one OWV-wide store, the indices as 16-byte stores. */
__device__ __forceinline__ void store_out(TO* __restrict__ y, int64_t* __restrict__ idx, int64_t o,
                                          const float (&best)[OWV], const int64_t (&bi)[OWV]) {
    if constexpr (OWV > 1) store_vec<TO, OWV>(y + o, best);
    else y[o] = from_f<TO>(best[0]);
    if (idx == nullptr) return;
    if constexpr (OWV > 1) {
#pragma unroll
        for (int j = 0; j < OWV; j += 2) *reinterpret_cast<longlong2*>(idx + o + j) = make_longlong2(bi[j], bi[j + 1]);
    } else {
        idx[o] = bi[0];
    }
}
'''

# A block: ROWS output rows of one plane. Their input rows are one contiguous span of the plane,
# copied to shared memory with VEC-wide loads; each thread then takes OWV neighbouring outputs.
TILE_KERNEL = r'''
__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y IDX_PARAM) {
    __shared__ __align__(16) TX tile[IN_ROWS * W];
    const int64_t nc = blockIdx.x / TILES;
    const int oh0 = (int)(blockIdx.x % TILES) * ROWS;
    const int oh1 = min(oh0 + ROWS, OH);
    const int ih0 = max(oh0 * SH - PH, 0);
    const int ih1 = min((oh1 - 1) * SH - PH + (KH - 1) * DH + 1, H);
    const TX* src = x + nc * H * W + (int64_t)ih0 * W;
    const int n = (ih1 - ih0) * W;
    for (int k = threadIdx.x * VEC; k < n; k += THREADS * VEC)
        *reinterpret_cast<Vec<TX, VEC>*>(tile + k) = *reinterpret_cast<const Vec<TX, VEC>*>(src + k);
    __syncthreads();
    const int items = (oh1 - oh0) * (OW / OWV);
    for (int q = threadIdx.x; q < items; q += THREADS) {
        const int oh = oh0 + q / (OW / OWV), ow0 = (q % (OW / OWV)) * OWV;
        float best[OWV];
        int64_t bi[OWV];
        windows(tile, ih0, oh, ow0, best, bi);
        store_out(y, IDX, (nc * OH + oh) * OW + ow0, best, bi);
    }
}
'''

# 3-wide windows, stride 2, padding 1 along the rows (any window down the columns). A thread: OWV
# outputs of one row, whose windows span input columns c0 - 1 .. c0 + 2*OWV - 1 (c0 = 2*OWV*k): one
# vector load of c0 .. c0 + 2*OWV - 1 per input row, and column c0 - 1 is the last element of the
# vector of the lane to the left (same row: k is the fastest index), or a load for lane 0. Every lane
# runs the KH rows (a row outside the input reads as -inf) so the shuffles see the whole warp.
# Padding is -inf under the strict comparison, so it never wins, as in PyTorch.
STRIP_KERNEL = r'''
__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y IDX_PARAM) {
    constexpr int NV = 2 * OWV;
    const int64_t q0 = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    const bool live = q0 < TOTAL / OWV;
    const int64_t q = live ? q0 : 0;
    const int k = (int)(q % (OW / OWV)), oh = (int)((q / (OW / OWV)) % OH);
    const int64_t nc = q / ((int64_t)(OW / OWV) * OH);
    const int c0 = k * NV;
    const int lane = threadIdx.x & 31;
    const TX* plane = x + nc * H * W;
    int hs = oh * SH - PH;
    while (hs < 0) hs += DH;
    float best[OWV];
    int64_t bi[OWV];
#pragma unroll
    for (int j = 0; j < OWV; ++j) {
        best[j] = -INFINITY;
        bi[j] = (int64_t)hs * W + (j == 0 && k == 0 ? 0 : c0 + 2 * j - 1);
    }
#pragma unroll
    for (int r = 0; r < KH; ++r) {
        const int ih = oh * SH - PH + r * DH;
        const bool ok = live && ih >= 0 && ih < H;
        float v[NV];
        if (ok) {
            const Vec<TX, NV> a = *reinterpret_cast<const Vec<TX, NV>*>(plane + (int64_t)ih * W + c0);
#pragma unroll
            for (int e = 0; e < NV; ++e) v[e] = to_f(a.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < NV; ++e) v[e] = -INFINITY;
        }
        float left = __shfl_up_sync(0xffffffffu, v[NV - 1], 1);
        if (lane == 0 || k == 0) left = (ok && k > 0) ? to_f(plane[(int64_t)ih * W + c0 - 1]) : -INFINITY;
        const int64_t rowi = (int64_t)ih * W + c0;
#pragma unroll
        for (int j = 0; j < OWV; ++j) {
            const float a0 = j == 0 ? left : v[2 * j - 1], a1 = v[2 * j], a2 = v[2 * j + 1];
            if (a0 > best[j] || a0 != a0) { best[j] = a0; bi[j] = rowi + 2 * j - 1; }
            if (a1 > best[j] || a1 != a1) { best[j] = a1; bi[j] = rowi + 2 * j; }
            if (a2 > best[j] || a2 != a2) { best[j] = a2; bi[j] = rowi + 2 * j + 1; }
        }
    }
    if (!live) return;
    store_out(y, IDX, (nc * OH + oh) * OW + (int64_t)k * OWV, best, bi);
}
'''

# OWV neighbouring outputs of a row per thread, read from global memory.
OWV_KERNEL = r'''
__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y IDX_PARAM) {
    const int64_t q = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (q >= TOTAL / OWV) return;
    const int ow0 = (int)(q % (OW / OWV)) * OWV, oh = (int)((q / (OW / OWV)) % OH);
    const int64_t nc = q / ((int64_t)(OW / OWV) * OH);
    float best[OWV];
    int64_t bi[OWV];
    windows(x + nc * H * W, 0, oh, ow0, best, bi);
    store_out(y, IDX, (nc * OH + oh) * OW + ow0, best, bi);
}
'''

# One output a thread, PER outputs a thread THREADS apart.
THREAD_KERNEL = r'''
__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y IDX_PARAM) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int64_t o = ((int64_t)blockIdx.x * PER + u) * THREADS + threadIdx.x;
        if (o >= TOTAL) return;
        const int ow = (int)(o % OW), oh = (int)((o / OW) % OH);
        const int64_t nc = o / ((int64_t)OW * OH);
        float best[1];
        int64_t bi[1];
        windows(x + nc * H * W, 0, oh, ow, best, bi);
        store_out(y, IDX, o, best, bi);
    }
}
'''
