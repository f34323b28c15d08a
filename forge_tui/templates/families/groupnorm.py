"""group_norm (NCHW, affine) and batch_norm in inference.

group_norm: a group of sample n is a contiguous run of (C/G) x HxW elements. CUDA modes:
  split    the group cut into CHUNK-element pieces; kernel 1 writes each piece's count/mean/M2
           into the caller's workspace; kernel 2 merges its group's pieces (Chan's formula) and
           normalises one piece of one channel plane with the per-channel affine. Two reads of the
           input and one write; with ORDER=reverse kernel 2 starts where kernel 1 ended, in L2.
  cluster  one pass: a thread-block cluster of CL blocks (sm_90) holds a group in registers; the
           sum, then the sum of squared deviations (exact two-pass variance), meet in distributed
           shared memory; each block writes its part. For groups that fit the cluster's registers.
  stash    one read from DRAM: a cluster of CL blocks per group, each block keeping the first part
           of its segment in shared memory (a buffer that also caps the blocks per SM at BPS, so the
           groups in flight fit L2) and re-reading the rest from L2 to normalise. Statistics per
           thread (sums around a pivot), merged with Chan's formula in the block and the cluster.
  stream   one launch, no cluster: blocks take work items in order from a ticket counter; the items
           are the statistics of piece p of group g and, AHEAD groups later in the order, the
           normalisation of that piece, which waits (spinning on the group's count of finished
           pieces) for the group's statistics. Reads of new groups and writes of finished ones
           overlap all the time; the second read of a piece comes AHEAD groups after the first,
           from L2 when AHEAD groups fit it.

  ring     one DRAM read, persistent: a cluster of CL blocks walks groups (cid, cid + clusters, ...),
           each block keeping its segment of the group in shared memory (the part that fits
           BPS blocks an SM; any rest is read twice, the second time from L2). LOAD=bulk: the segment
           arrives in chunks by bulk copies (TMA), one mbarrier a chunk, the statistics of a chunk
           starting as it lands; once the block has stored a group, the next group's chunks are
           requested while those stores drain. LOAD=thread: each thread stages its own elements of
           the next group (cp.async) as soon as it has written them for this one.

batch_norm (running statistics, training=False): one pass, per-channel scale and shift.
"""

from __future__ import annotations

from ...cards import Card
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ..base import (
    CTYPE,
    FLOAT_DTYPES,
    Family,
    Match,
    cluster_axes,
    cluster_fits,
    cluster_mode_ok,
    header,
    input_index,
    numel,
    ring_cap,
    ring_launch,
    ring_stash,
    stash_bytes,
    stream_ahead,
    stream_counters,
    stream_ws_bytes,
    vec_widths,
    workspace_entry,
)
from ..cpu_common import COMMON as CPU_COMMON
from ..cuda_common import COMMON as CUDA_COMMON
from ..device import DEFAULT_DEVICE, DeviceProps

BN_TARGETS = {  # op -> index of (weight, bias, running_mean, running_var), training flag index, eps index
    "aten.native_batch_norm.default": (1, 2, 3, 4, 5, 7),
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4, None, 6),
    "aten.cudnn_batch_norm.default": (1, 2, 3, 4, 5, 7),
}


class GroupNorm(Family):
    name = "group_norm"

    def match(self, card: Card) -> Match | None:
        if card.kind != "op" or card.target != "aten.native_group_norm.default" or len(card.outputs) != 3:
            return None
        a = card.program["nodes"][0]["args"]
        xi, wi, bi = input_index(a[0]), input_index(a[1]), input_index(a[2])
        n, c, hw, g, eps = a[3], a[4], a[5], a[6], a[7]
        if xi is None or not all(isinstance(v, int) for v in (n, c, hw, g)) or c % g:
            return None
        x = card.inputs[xi]
        if x.dtype not in FLOAT_DTYPES or not x.contiguous or not card.outputs[0].contiguous:
            return None
        return Match(self.name, card, {
            "x": xi, "w": wi, "b": bi, "n": n, "c": c, "hw": hw, "g": g, "eps": float(eps), "tin": x.dtype,
            "tw": card.inputs[wi].dtype if wi is not None else x.dtype,
            "tb": card.inputs[bi].dtype if bi is not None else x.dtype,
            "tout": card.outputs[0].dtype, "tstat": card.outputs[1].dtype,
            "group_len": (c // g) * hw})

    def _vecs(self, m: Match) -> list[int]:
        return vec_widths(m.info["hw"], ITEMSIZE[m.info["tin"]])

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 2, 4]}
        ax: dict[str, list] = {"mode": ["ring", "stream", "stash", "cluster", "split"],
                               "chunk": [2048, 4096, 8192, 16384, 32768, 65536],
                               "threads": [128, 256, 512, 1024], "vec": self._vecs(m), "order": ["reverse", "forward"],
                               "cl": [2, 4, 8, 16], "bps": [1, 2, 4], "ahead": [2, 4, 8, 16, 32], "load": ["bulk", "thread"]}
        return cluster_axes(ax, device)

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        if p["vec"] not in self._vecs(m):
            return False
        if not cluster_mode_ok(p, device):
            return False
        if p.get("mode") == "cluster":
            return cluster_fits(m.info["group_len"], p["cl"], p["threads"], p["vec"])
        if p.get("mode") == "ring":
            glen, itemsize = m.info["group_len"], ITEMSIZE[m.info["tin"]]
            if glen % (p["cl"] * p["vec"]) or (glen // p["cl"] * itemsize) % 16 \
                    or p["threads"] * p["bps"] > device.max_threads_per_sm:
                return False  # (bulk copies move multiples of 16 bytes from 16-byte boundaries)
            return ring_stash(glen // p["cl"], itemsize, p["threads"] * p["vec"], p["bps"], device) > 0
        if p.get("mode") == "stash":
            glen = m.info["group_len"]
            return glen % (p["cl"] * p["vec"]) == 0 and glen // p["cl"] >= p["threads"] * p["vec"] and \
                p["threads"] * p["bps"] <= device.max_threads_per_sm and \
                stash_bytes(p["bps"], device) + 1024 <= device.smem_per_block  # (1 KB of static shared memory)
        if p.get("mode") == "stream":
            return (p["chunk"] % (p["threads"] * p["vec"]) == 0 and m.info["group_len"] % p["chunk"] == 0
                    and p["ahead"] <= m.info["n"] * m.info["g"])
        return p["chunk"] % (p["threads"] * p["vec"]) == 0

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 1}
        vec = self._vecs(m)[0]
        total = m.info["n"] * m.info["c"] * m.info["hw"]
        chunk = 16384
        while chunk > 2048 and total // chunk < 4 * device.sms:
            chunk //= 2
        ng = m.info["n"] * m.info["g"]
        gbytes = m.info["group_len"] * ITEMSIZE[m.info["tin"]]
        # the stream mode's normalising read of a piece comes AHEAD groups after its first read:
        # those groups' inputs should take about a quarter of L2, which holds their outputs too
        ahead = stream_ahead(ng, gbytes, (2, 4, 8, 16, 32), device.l2_bytes * 4 // 15)
        base = {"mode": "split", "chunk": max(chunk, 256 * vec), "threads": 256, "vec": vec, "order": "reverse",
                "cl": 8, "bps": 2, "ahead": ahead, "load": "bulk"}
        groups = m.info["n"] * m.info["g"]
        # The first choice, in this order (docs/benchmarks.md has the measurements behind it):
        # - the persistent ring (_ring), for groups of 512 KB and more (a sixteenth of at least
        #   32 KB) and enough of them for every SM: one DRAM read, the next group's loads
        #   overlapping this group's stores;
        # - the stash, where a block's shared memory holds at least half of its eighth of a group:
        #   one DRAM read (holding less, a block re-reads most of its segment from L2, and split is
        #   as fast);
        # - a cluster holding the group in registers, where enough groups fill the GPU;
        # - else split. The stream mode stays a move.
        # The ring, the stash and the cluster need thread-block clusters (valid() checks).
        stash = {**base, "mode": "stash", "cl": 8, "threads": 1024, "bps": 2}
        seg_bytes = m.info["group_len"] // 8 * ITEMSIZE[m.info["tin"]]
        ring = {**base, **self._ring(m, device)}
        if gbytes >= 512 << 10 and groups * 16 >= device.sms and self.valid(m, ring, backend, device):
            return ring
        if groups * 8 >= device.sms and 2 * stash_bytes(2, device) >= seg_bytes and self.valid(m, stash, backend, device):
            return stash
        for cl, threads in ((8, 1024), (8, 512), (4, 1024), (4, 512)):
            cluster = {**base, "mode": "cluster", "cl": cl, "threads": threads}
            if groups * cl >= device.sms and self.valid(m, cluster, backend, device):
                return cluster
        return base

    def _ring(self, m: Match, device: DeviceProps) -> dict:
        """The ring's settings: clusters of 16 at 512 threads, each thread staging its own elements
        (cp.async) as it writes them; three blocks an SM where a sixteenth of a group fits a block's
        share of shared memory at three, else two."""
        seg, itemsize = m.info["group_len"] // 16, ITEMSIZE[m.info["tin"]]
        bps = 3 if ring_cap(itemsize, 3, device) >= seg else 2
        return {"mode": "ring", "cl": 16, "threads": 512, "bps": bps, "load": "thread"}

    def mode_settings(self, m: Match, mode: str, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """Settings for a move into ``mode``: the stream mode at 512 threads a block (its registers
        spill at 1024, and 256 is slower), the stash at 1024 in clusters of 8 at two blocks an SM,
        the ring as _ring, split at 512 and the cluster at 1024 in clusters of 8."""
        if backend == "cpu":
            return {}
        if mode == "ring":
            return {k: v for k, v in self._ring(m, device).items() if k != "mode"}
        return {"stream": {"threads": 512}, "stash": {"threads": 1024, "bps": 2, "cl": 8},
                "cluster": {"threads": 1024, "cl": 8}, "split": {"threads": 512}}.get(mode, {})

    def relevant(self, p: dict) -> dict:
        """The parameters that change the kernel (chunk and order only split, cl the cluster modes,
        bps only stash and ring)."""
        q = dict(p)
        if q.get("mode") in ("cluster", "stash", "ring"):
            q.pop("chunk", None)
            q.pop("order", None)
        elif "mode" in q:
            q.pop("cl", None)
        if q.get("mode") not in ("stash", "ring"):
            q.pop("bps", None)
        if q.get("mode") != "ring":
            q.pop("load", None)
        if q.get("mode") != "stream":
            q.pop("ahead", None)
        if q.get("mode") == "stream":
            q.pop("order", None)
        return q

    def passes(self, m: Match, p: dict) -> int:
        """Reads of the input from DRAM (the stash's second read comes from shared memory and L2)."""
        return 1 if p.get("mode") in ("cluster", "stash", "stream", "ring") else 2


    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        return header(self.name, p, 2) + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p, device))

    def _cpu(self, m: Match, p: dict) -> str:
        i, ct = m.info, CPU_CTYPE
        wexpr = "to_f(w[ch])" if i["w"] is not None else "1.f"
        bexpr = "to_f(b[ch])" if i["b"] is not None else "0.f"
        return CPU_COMMON + f'''
typedef {ct[i["tin"]]} TX; typedef {ct[i["tw"]]} TW; typedef {ct[i["tb"]]} TB; typedef {ct[i["tout"]]} TO; typedef {ct[i["tstat"]]} TS;
static const int64_t N = {i["n"]}, C = {i["c"]}, HW = {i["hw"]}, G = {i["g"]}, CPG = {i["c"] // i["g"]};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[{i["x"]}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    const TX* x = (const TX*)in[{i["x"]}].data;
    {"const TW* w = (const TW*)in[%d].data;" % i["w"] if i["w"] is not None else ""}
    {"const TB* b = (const TB*)in[%d].data;" % i["b"] if i["b"] is not None else ""}
    TO* y = (TO*)out[0].data;
    TS* mean_out = (TS*)out[1].data;
    TS* rstd_out = (TS*)out[2].data;
#pragma omp parallel for schedule(static, {p["chunk"]}) if(N * C * HW >= PARALLEL_MIN)
    for (int64_t ng = 0; ng < N * G; ++ng) {{
        const TX* a = x + ng * CPG * HW;
        TO* o = y + ng * CPG * HW;
        double sum = 0.0;
        for (int64_t k = 0; k < CPG * HW; ++k) sum += to_f(a[k]);
        const float mean = (float)(sum / (double)(CPG * HW));
        double var = 0.0;
        for (int64_t k = 0; k < CPG * HW; ++k) {{ const double d = to_f(a[k]) - mean; var += d * d; }}
        const float rstd = 1.f / std::sqrt((float)(var / (double)(CPG * HW)) + (float){i["eps"]!r});
        for (int64_t cc = 0; cc < CPG; ++cc) {{
            const int64_t ch = (ng % G) * CPG + cc;
            const float scale = rstd * {wexpr}, shift = {bexpr} - mean * scale;
            for (int64_t k = 0; k < HW; ++k) o[cc * HW + k] = from_f<TO>(to_f(a[cc * HW + k]) * scale + shift);
        }}
        mean_out[ng] = from_f<TS>(mean);
        rstd_out[ng] = from_f<TS>(rstd);
    }}
    return 0;
}}
'''

    def _cuda(self, m: Match, p: dict, device: DeviceProps) -> str:
        i, ct = m.info, CTYPE
        threads, vec = p["threads"], p["vec"]
        glen = i["group_len"]
        ng = i["n"] * i["g"]
        total = ng * glen
        cpg = i["c"] // i["g"]
        wp = f"(const TW*)in[{i['w']}].data" if i["w"] is not None else "(const TW*)nullptr"
        bp = f"(const TB*)in[{i['b']}].data" if i["b"] is not None else "(const TB*)nullptr"
        types = (f'typedef {ct[i["tin"]]} TX; typedef {ct[i["tw"]]} TW; typedef {ct[i["tb"]]} TB; '
                 f'typedef {ct[i["tout"]]} TO; typedef {ct[i["tstat"]]} TS;')
        check = (f'    if (forge_numel(&in[{i["x"]}]) != TOTAL || !forge_is_contiguous(&out[0])) return 2;\n'
                 f'    cudaStream_t s = (cudaStream_t)stream;\n'
                 f'    const TX* x = (const TX*)in[{i["x"]}].data;\n'
                 f'    TO* y = (TO*)out[0].data;\n'
                 f'    TS* mean_out = (TS*)out[1].data;\n'
                 f'    TS* rstd_out = (TS*)out[2].data;\n'
                 f'    const bool aligned = forge_aligned(x, {vec} * sizeof(TX)) && forge_aligned(y, {vec} * sizeof(TO));\n')
        if p.get("mode") == "cluster":
            cl = p["cl"]
            seg = glen // cl
            nv, nv1 = -(-seg // (threads * vec)), -(-seg // threads)
            args = f"x, {wp}, {bp}, y, mean_out, rstd_out, {glen}, {i['hw']}, {i['g']}, {cpg}, (float){i['eps']!r}"
            return CUDA_COMMON + KERNELS + f"""
{types}
static const int64_t TOTAL = {total};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
{check}    if (aligned) gn_cluster<TX, TW, TB, TO, TS, {cl}, {threads}, {vec}, {nv}><<<{ng * cl}, {threads}, 0, s>>>({args});
    else gn_cluster<TX, TW, TB, TO, TS, {cl}, {threads}, 1, {nv1}><<<{ng * cl}, {threads}, 0, s>>>({args});
    return (int)cudaGetLastError();
}}
"""
        if p.get("mode") == "stash":
            cl, smem = p["cl"], stash_bytes(p["bps"], device)
            seg = glen // cl
            stash = min(seg, smem // ITEMSIZE[i["tin"]]) // vec * vec
            args = (f"x, {wp}, {bp}, y, mean_out, rstd_out, {glen}, {i['hw']}, {i['g']}, {cpg}, (float){i['eps']!r}, "
                    f"{stash}")
            k_vec = f"gn_stash<TX, TW, TB, TO, TS, {cl}, {threads}, {vec}>"
            k_one = f"gn_stash<TX, TW, TB, TO, TS, {cl}, {threads}, 1>"
            return CUDA_COMMON + KERNELS + STASH_KERNEL + f"""
{types}
static const int64_t TOTAL = {total};
static const int SMEM = {smem};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
{check}    /* more than 48 KB of dynamic shared memory is opt-in, per kernel (set on every call: no state) */
    if (aligned) {{
        cudaFuncSetAttribute({k_vec}, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        {k_vec}<<<{ng * cl}, {threads}, SMEM, s>>>({args});
    }} else {{
        cudaFuncSetAttribute({k_one}, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        {k_one}<<<{ng * cl}, {threads}, SMEM, s>>>({args});
    }}
    return (int)cudaGetLastError();
}}
"""
        if p.get("mode") == "ring":
            cl = p["cl"]
            stash = ring_stash(glen // cl, ITEMSIZE[i["tin"]], threads * vec, p["bps"], device)
            smem = stash * ITEMSIZE[i["tin"]]
            args = (f"x, {wp}, {bp}, y, mean_out, rstd_out, {glen}, {i['hw']}, {i['g']}, {cpg}, (float){i['eps']!r}, "
                    f"{stash}, (int)NG")
            bulk = "true" if p.get("load", "bulk") == "bulk" else "false"
            k_vec = f"gn_ring<TX, TW, TB, TO, TS, {cl}, {threads}, {vec}, {bulk}>"
            k_one = f"gn_ring<TX, TW, TB, TO, TS, {cl}, {threads}, 1, false>"
            return CUDA_COMMON + KERNELS + RING_KERNEL + f"""
{types}
static const int64_t NG = {ng}, TOTAL = {total};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
{check}    if (aligned && forge_aligned(x, 16))  /* bulk copies start on 16-byte boundaries */
{ring_launch(k_vec, "NG", cl, threads, smem, args)}    else
{ring_launch(k_one, "NG", cl, threads, smem, args)}    return (int)cudaGetLastError();
}}
"""
        if p.get("mode") == "stream":
            chunk, ahead = p["chunk"], p["ahead"]
            pieces = glen // chunk
            # 1024 threads an SM: loads enough in flight, and few items in flight, so that AHEAD groups
            # cover them and the normalising reads come while the pieces are still in L2
            per_sm = max(1, 1024 // threads)
            grid = device.sms * per_sm
            args = (f"x, {wp}, {bp}, y, mean_out, rstd_out, part, done, ticket, {glen}, {i['hw']}, {i['g']}, {cpg}, "
                    f"(float){i['eps']!r}")
            return CUDA_COMMON + KERNELS + STREAM_KERNEL + f"""
{types}
static const int64_t NG = {ng}, TOTAL = {total};
static const int PIECES = {pieces}, CHUNK = {chunk}, AHEAD = {ahead};
/* per piece: count, mean, M2; then a finished-pieces count per group and the ticket counter */
{stream_ws_bytes("(int64_t)sizeof(float) * NG * PIECES * 3", "NG")}
{workspace_entry("WS_BYTES")}
{check}    if (ws_bytes < WS_BYTES) return 4;
    float* part = (float*)workspace;
{stream_counters("NG")}    const unsigned items = (unsigned)((NG + AHEAD) * PIECES * 2);
    if (aligned) gn_stream<TX, TW, TB, TO, TS, {threads}, {vec}, PIECES, CHUNK, AHEAD><<<{grid}, {threads}, 0, s>>>({args}, (int)NG, items);
    else gn_stream<TX, TW, TB, TO, TS, {threads}, 1, PIECES, CHUNK, AHEAD><<<{grid}, {threads}, 0, s>>>({args}, (int)NG, items);
    return (int)cudaGetLastError();
}}
"""
        chunk = p["chunk"]
        pieces = -(-glen // chunk)
        unroll = 4
        per_plane = -(-i["hw"] // (threads * vec * unroll))
        per_plane1 = -(-i["hw"] // (threads * unroll))
        planes = i["n"] * i["c"]
        rev = "true" if p.get("order", "reverse") == "reverse" else "false"
        apply_args = f"x, {wp}, {bp}, y, ws, mean_out, rstd_out, {pieces}, {i['hw']}, {i['c']}, {cpg}, (float){i['eps']!r}"
        return CUDA_COMMON + KERNELS + f"""
{types}
static const int64_t NG = {ng}, GLEN = {glen}, TOTAL = {total};
static const int64_t WS_BYTES = (int64_t)sizeof(float) * NG * {pieces} * 3;  /* per piece: count, mean, M2 */

{workspace_entry("WS_BYTES")}
{check}    if (ws_bytes < WS_BYTES) return 4;
    float* ws = (float*)workspace;
    if (aligned) {{
        gn_partial<TX, {threads}, {vec}><<<NG * {pieces}, {threads}, 0, s>>>(x, ws, GLEN, {chunk}, {pieces});
        gn_apply<TX, TW, TB, TO, TS, {threads}, {vec}, {unroll}, {rev}><<<{planes * per_plane}, {threads}, 0, s>>>({apply_args}, {per_plane});
    }} else {{
        gn_partial<TX, {threads}, 1><<<NG * {pieces}, {threads}, 0, s>>>(x, ws, GLEN, {chunk}, {pieces});
        gn_apply<TX, TW, TB, TO, TS, {threads}, 1, {unroll}, {rev}><<<{planes * per_plane1}, {threads}, 0, s>>>({apply_args}, {per_plane1});
    }}
    return (int)cudaGetLastError();
}}
"""


KERNELS = r"""
#include <cooperative_groups.h>

/* Sums of VEC values' deviations from a pivot (the group's first element): the shifted sums keep
   the variance exact in fp32 (block_welford turns them into count, mean and M2). */
template <int VEC>
__device__ __forceinline__ void pivot_add(const float (&v)[VEC], float pivot, float& s1, float& s2) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = v[j] - pivot; s1 += d; s2 = fmaf(d, d, s2); }
}
template <typename T, int VEC>
__device__ __forceinline__ void pivot_add(const Vec<T, VEC>& raw, float pivot, float& s1, float& s2) {
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = to_f(raw.v[j]);
    pivot_add<VEC>(v, pivot, s1, s2);
}

/* max(x, 0) that keeps a NaN (fmaxf(NaN, 0) is 0: a group holding a NaN or an inf would get a
   finite rstd where PyTorch's is NaN). */
__device__ __forceinline__ float clamp0(float x) { return x < 0.f ? 0.f : x; }

/* Chan's parallel merge of (count, mean, M2). */
__device__ __forceinline__ void welford_merge(float& n, float& mean, float& m2, float n2, float mean2, float m22) {
    if (n2 == 0.f) return;
    if (n == 0.f) { n = n2; mean = mean2; m2 = m22; return; }
    const float nn = n + n2, d = mean2 - mean;
    mean += d * (n2 / nn);
    m2 += m22 + d * d * (n * n2 / nn);
    n = nn;
}

__device__ __forceinline__ void welford_warp(float& n, float& mean, float& m2) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        welford_merge(n, mean, m2, __shfl_xor_sync(0xffffffffu, n, o), __shfl_xor_sync(0xffffffffu, mean, o),
                      __shfl_xor_sync(0xffffffffu, m2, o));
}

/* A block's (count, mean, M2) from each thread's sums of (v - pivot) and their squares over cnt
   values (the pivot, a value of the group, keeps the sums from cancelling), merged with Chan's
   formula: the result is in every lane of warp 0. Every thread of the block must call it; it
   ends with warp 0 reading shared memory, so a second call needs a barrier before it. */
template <int THREADS>
__device__ __forceinline__ void block_welford(float cnt, float pivot, float s1, float s2, float& n, float& mean,
                                              float& m2) {
    __shared__ float sn[32], smean[32], sm2[32];
    n = cnt;
    mean = cnt > 0.f ? pivot + s1 / cnt : 0.f;
    m2 = cnt > 0.f ? clamp0(s2 - s1 * s1 / cnt) : 0.f;
    welford_warp(n, mean, m2);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sn[w] = n; smean[w] = mean; sm2[w] = m2; }
    __syncthreads();
    if (w == 0) {
        n = lane < THREADS / 32 ? sn[lane] : 0.f;
        mean = lane < THREADS / 32 ? smean[lane] : 0.f;
        m2 = lane < THREADS / 32 ? sm2[lane] : 0.f;
        welford_warp(n, mean, m2);
    }
}

/* Lane 0 of the warp holding a group's merged statistics: mean and rstd to the block (stat) and,
   where this block is the one to, to the outputs. */
template <typename TS>
__device__ __forceinline__ void publish_stats(float n, float mean, float m2, float eps, float* stat, bool write,
                                              TS* __restrict__ mean_out, TS* __restrict__ rstd_out, int64_t g) {
    const float rstd = rsqrtf(clamp0(m2 / n) + eps);
    stat[0] = mean;
    stat[1] = rstd;
    if (write) { mean_out[g] = from_f<TS>(mean); rstd_out[g] = from_f<TS>(rstd); }
}

/* Normalise VEC values of channel ch (x * scale + shift with the channel's affine) and store them. */
template <typename TW, typename TB, typename TO, int VEC>
__device__ __forceinline__ void gn_write(TO* __restrict__ o, float (&v)[VEC], int ch, float mean, float rstd,
                                         const TW* __restrict__ w, const TB* __restrict__ b) {
    const float scale = rstd * (w ? to_f(w[ch]) : 1.f);
    const float shift = (b ? to_f(b[ch]) : 0.f) - mean * scale;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = v[j] * scale + shift;
    store_vec<TO, VEC>(o, v);
}

/* Warp 0 of a cluster-mode block, after the cluster barrier: merge the CL blocks' partial (count,
   mean, M2), each in its block's `part`, and publish mean and rstd (to the block's stat and,
   from rank 0, the outputs). */
template <int CL, typename TS>
__device__ __forceinline__ void cluster_publish(cooperative_groups::cluster_group& cluster, float* part, float eps,
                                                float* stat, bool write, TS* __restrict__ mean_out,
                                                TS* __restrict__ rstd_out, int64_t g) {
    const int lane = threadIdx.x & 31;
    float n = 0.f, mean = 0.f, m2 = 0.f;
    if (lane < CL) {
        const float* q = cluster.map_shared_rank(part, lane);
        n = q[0]; mean = q[1]; m2 = q[2];
    }
    welford_warp(n, mean, m2);
    if (lane == 0) publish_stats(n, mean, m2, eps, stat, write, mean_out, rstd_out, g);
}

/* Pass 1: per piece (count, mean, M2). Each thread sums (v - pivot) and its square (pivot: the
   group's first element, so the sums do not cancel), then threads merge with Chan's formula. */
template <typename TX, int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) gn_partial(const TX* __restrict__ x, float* __restrict__ ws, int64_t glen,
                                                      int chunk, int pieces) {
    const int64_t g = blockIdx.x / pieces;
    const int piece = blockIdx.x % pieces;
    const int64_t start = piece * (int64_t)chunk, end = min(glen, start + (int64_t)chunk);
    const TX* a = x + g * glen;
    const float pivot = to_f(a[0]);
    float s1 = 0.f, s2 = 0.f, cnt = 0.f;
#pragma unroll 4
    for (int64_t k = start + threadIdx.x * VEC; k < end; k += THREADS * VEC) {
        float v[VEC];
        load_vec<TX, VEC>(a + k, v);
        pivot_add<VEC>(v, pivot, s1, s2);
        cnt += (float)VEC;
    }
    float n, mean, m2;
    block_welford<THREADS>(cnt, pivot, s1, s2, n, mean, m2);
    if (threadIdx.x == 0) { ws[blockIdx.x * 3] = n; ws[blockIdx.x * 3 + 1] = mean; ws[blockIdx.x * 3 + 2] = m2; }
}

/* Pass 2: block b = one piece of one (n, c) plane; warp 0 merges the group's pieces from the
   workspace, the block normalises with the channel's scale and shift. REVERSE walks the blocks
   backwards so the first reads are the ones pass 1 made last (still in L2). */
template <typename TX, typename TW, typename TB, typename TO, typename TS, int THREADS, int VEC, int UNROLL, bool REVERSE>
__global__ void __launch_bounds__(THREADS) gn_apply(const TX* __restrict__ x, const TW* __restrict__ w,
                                                    const TB* __restrict__ b, TO* __restrict__ y,
                                                    const float* __restrict__ ws, TS* __restrict__ mean_out,
                                                    TS* __restrict__ rstd_out, int pieces, int hw, int channels,
                                                    int cpg, float eps, int per_plane) {
    const int64_t blk = REVERSE ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int64_t plane = blk / per_plane;
    const int part = (int)(blk % per_plane);
    const int c = (int)(plane % channels);
    const int64_t g = (plane / channels) * (channels / cpg) + c / cpg;
    __shared__ float stat[2];
    if (threadIdx.x < 32) {
        float n = 0.f, mean = 0.f, m2 = 0.f;
        for (int k = threadIdx.x; k < pieces; k += 32) {
            const float* q = ws + (g * pieces + k) * 3;
            welford_merge(n, mean, m2, q[0], q[1], q[2]);
        }
        welford_warp(n, mean, m2);
        if (threadIdx.x == 0) {
            const float rstd = rsqrtf(clamp0(m2 / n) + eps);
            stat[0] = mean;
            stat[1] = rstd;
            if (part == 0 && c % cpg == 0) { mean_out[g] = from_f<TS>(mean); rstd_out[g] = from_f<TS>(rstd); }
        }
    }
    __syncthreads();
    const float mean = stat[0], rstd = stat[1];
    const float scale = rstd * (w ? to_f(w[c]) : 1.f);
    const float shift = (b ? to_f(b[c]) : 0.f) - mean * scale;
    const TX* a = x + plane * hw;
    TO* o = y + plane * hw;
    const int base = part * THREADS * VEC * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int k = base + (u * THREADS + threadIdx.x) * VEC;
        if (k < hw) {
            float v[VEC];
            load_vec<TX, VEC>(a + k, v);
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = v[j] * scale + shift;
            store_vec<TO, VEC>(o + k, v);
        }
    }
}

/* One pass: a cluster of CL blocks per group (g = n * G + group), each holding glen/CL elements
   in registers. Mean from the cluster's sum, then the variance from the sum of squared deviations. */
template <typename TX, typename TW, typename TB, typename TO, typename TS, int CL, int THREADS, int VEC, int NV>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS)
gn_cluster(const TX* __restrict__ x, const TW* __restrict__ w, const TB* __restrict__ b, TO* __restrict__ y,
           TS* __restrict__ mean_out, TS* __restrict__ rstd_out, int glen, int hw, int groups, int cpg, float eps) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float scratch[THREADS / 32];
    __shared__ float part[2];
    const int rank = (int)cluster.block_rank();
    const int64_t g = blockIdx.x / CL;
    const int seg = glen / CL;
    const int64_t off = g * (int64_t)glen + (int64_t)rank * seg;
    const int t = threadIdx.x;
    float v[NV][VEC];
    float s1 = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c < seg) {
            load_vec<TX, VEC>(x + off + c, v[k]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) s1 += v[k][j];
        }
    }
    s1 = row_reduce<THREADS, false>(s1, scratch);
    if (t == 0) part[0] = s1;
    cluster.sync();
    s1 = 0.f;
#pragma unroll
    for (int r = 0; r < CL; ++r) s1 += *cluster.map_shared_rank(&part[0], r);
    const float mean = s1 / (float)glen;
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c < seg) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) { const float d = v[k][j] - mean; s2 = fmaf(d, d, s2); }
        }
    }
    s2 = row_reduce<THREADS, false>(s2, scratch);
    if (t == 0) part[1] = s2;
    cluster.sync();
    s2 = 0.f;
#pragma unroll
    for (int r = 0; r < CL; ++r) s2 += *cluster.map_shared_rank(&part[1], r);
    cluster.sync();  /* no block leaves while another may still read its shared memory */
    const float rstd = rsqrtf(s2 / (float)glen + eps);
    if (rank == 0 && t == 0) { mean_out[g] = from_f<TS>(mean); rstd_out[g] = from_f<TS>(rstd); }
    const int ch0 = (int)(g % groups) * cpg;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c < seg) {
            /* VEC divides hw: a vector is in one channel */
            gn_write<TW, TB, TO, VEC>(y + off + c, v[k], ch0 + (rank * seg + c) / hw, mean, rstd, w, b);
        }
    }
}
"""


STASH_KERNEL = r"""
/* One read from DRAM: a cluster of CL blocks per group (g = n * G + group), block `rank` owning
   the contiguous segment [rank * seg, (rank + 1) * seg) of it. Pass A streams the segment once,
   keeping its first `stash` elements in shared memory, and sums it around a pivot (the group's
   first element) per thread; the threads' (count, mean, M2) merge in the block, then across the
   cluster through distributed shared memory. Pass B normalises: the stashed part from shared
   memory, the rest re-read (from L2: the dynamic shared memory also caps the blocks per SM, so the
   groups in flight fit it). */
template <typename TX, typename TW, typename TB, typename TO, typename TS, int CL, int THREADS, int VEC>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS)
gn_stash(const TX* __restrict__ x, const TW* __restrict__ w, const TB* __restrict__ b, TO* __restrict__ y,
         TS* __restrict__ mean_out, TS* __restrict__ rstd_out, int glen, int hw, int groups, int cpg, float eps,
         int stash) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    extern __shared__ __align__(16) unsigned char stash_raw[];
    TX* keep = reinterpret_cast<TX*>(stash_raw);
    __shared__ float part[3];
    __shared__ float stat[2];
    const int rank = (int)cluster.block_rank();
    const int64_t g = blockIdx.x / CL;
    const int seg = glen / CL;
    const TX* a = x + g * (int64_t)glen + (int64_t)rank * seg;
    TO* o = y + g * (int64_t)glen + (int64_t)rank * seg;
    const int t = threadIdx.x;
    const float pivot = to_f(x[g * (int64_t)glen]);
    float s1 = 0.f, s2 = 0.f, cnt = 0.f;
#pragma unroll 4
    for (int k = t * VEC; k < seg; k += THREADS * VEC) {
        const Vec<TX, VEC> raw = *reinterpret_cast<const Vec<TX, VEC>*>(a + k);
        if (k < stash) *reinterpret_cast<Vec<TX, VEC>*>(keep + k) = raw;
        pivot_add(raw, pivot, s1, s2);
        cnt += (float)VEC;
    }
    float n, mean, m2;
    block_welford<THREADS>(cnt, pivot, s1, s2, n, mean, m2);
    const int wid = t >> 5;
    if (t == 0) { part[0] = n; part[1] = mean; part[2] = m2; }
    cluster.sync();
    if (wid == 0) cluster_publish<CL>(cluster, part, eps, stat, rank == 0, mean_out, rstd_out, g);
    __syncthreads();
    mean = stat[0];
    const float rstd = stat[1];
    const int ch0 = (int)(g % groups) * cpg;
#pragma unroll 4
    for (int k = t * VEC; k < seg; k += THREADS * VEC) {
        const Vec<TX, VEC> raw = k < stash ? *reinterpret_cast<const Vec<TX, VEC>*>(keep + k)
                                           : *reinterpret_cast<const Vec<TX, VEC>*>(a + k);
        float v[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = to_f(raw.v[j]);
        /* VEC divides hw: a vector is in one channel */
        gn_write<TW, TB, TO, VEC>(o + k, v, ch0 + (rank * seg + k) / hw, mean, rstd, w, b);
    }
    cluster.sync();  /* no block leaves while another may still read its shared memory */
}
"""


RING_KERNEL = r"""
/* One DRAM read, persistent: the cluster of CL blocks numbered cid walks groups g = cid,
   cid + clusters, ... (g = n * G + group); block `rank` owns segment [rank * seg, (rank + 1) * seg)
   of each and keeps its first `stash` elements in shared memory, in chunks of one vector per
   thread (thread t's element of chunk c: k = c * THREADS * VEC + t * VEC). BULK: one thread loads
   each chunk with a bulk copy counted on the chunk's mbarrier, and the statistics of a chunk start
   as soon as it lands; once the block has normalised and stored its chunks (the stores drain
   while the loads run), a barrier, then the next group's chunks are requested. Otherwise (inputs
   not on 16-byte boundaries) each thread stages its own elements with cp.async, as it stores
   them. Statistics as in the stash mode (sums around a pivot, Chan's merge in the block and
   across the cluster); the cluster's partials alternate between two buffers by round, so a block
   can publish round r + 1 while another still reads round r (never r + 2: the cluster barrier of
   round r + 1 waits for every block). Elements past the stash are read twice, the second time
   from L2. */
template <typename TX, typename TW, typename TB, typename TO, typename TS, int CL, int THREADS, int VEC, bool BULK>
__global__ void __launch_bounds__(THREADS)
gn_ring(const TX* __restrict__ x, const TW* __restrict__ w, const TB* __restrict__ b, TO* __restrict__ y,
        TS* __restrict__ mean_out, TS* __restrict__ rstd_out, int glen, int hw, int groups, int cpg, float eps,
        int stash, int ng) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    constexpr int CE = THREADS * VEC;  /* elements a chunk */
    extern __shared__ __align__(16) unsigned char stash_raw[];
    TX* keep = reinterpret_cast<TX*>(stash_raw);
    __shared__ __align__(8) uint64_t bar[BULK ? RING_MAX_CHUNKS : 1];
    __shared__ float part[2][3];
    __shared__ float stat[2];
    const int rank = (int)cluster.block_rank();
    const int clusters = (int)(gridDim.x / CL), cid = (int)(blockIdx.x / CL);
    const int seg = glen / CL, nc = stash / CE;
    const int64_t seg0 = (int64_t)rank * seg;
    const int t = threadIdx.x, wid = t >> 5;
    ring_start<TX, VEC, CE, BULK>(keep, bar, x + (int64_t)cid * glen + seg0, nc, stash, cid < ng);
    int round = 0;
    for (int g = cid; g < ng; g += clusters, round ^= 1) {
        const TX* a = x + (int64_t)g * glen + seg0;
        TO* o = y + (int64_t)g * glen + seg0;
        const float pivot = to_f(x[(int64_t)g * glen]);
        float s1 = 0.f, s2 = 0.f, cnt = 0.f;
        if constexpr (!BULK) stage_wait();
        for (int c = 0; c < nc; ++c) {
            if constexpr (BULK) bulk_wait(&bar[c], (unsigned)round);
            const Vec<TX, VEC> raw = *reinterpret_cast<const Vec<TX, VEC>*>(keep + c * CE + t * VEC);
            pivot_add(raw, pivot, s1, s2);
            cnt += (float)VEC;
        }
        for (int k = stash + t * VEC; k < seg; k += CE) {
            float v[VEC];
            load_vec<TX, VEC>(a + k, v);
            pivot_add<VEC>(v, pivot, s1, s2);
            cnt += (float)VEC;
        }
        float n, mean, m2;
        block_welford<THREADS>(cnt, pivot, s1, s2, n, mean, m2);
        if (t == 0) { part[round][0] = n; part[round][1] = mean; part[round][2] = m2; }
        cluster.sync();
        if (wid == 0) cluster_publish<CL>(cluster, part[round], eps, stat, rank == 0, mean_out, rstd_out, g);
        __syncthreads();
        mean = stat[0];
        const float rstd = stat[1];
        const int ch0 = (g % groups) * cpg;
        const int next = g + clusters;
        const TX* an = x + (int64_t)next * glen + seg0;  /* dereferenced only when next < ng */
#pragma unroll 4
        for (int k = t * VEC; k < stash; k += CE) {
            const Vec<TX, VEC> raw = *reinterpret_cast<const Vec<TX, VEC>*>(keep + k);
            float v[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = to_f(raw.v[j]);
            /* VEC divides hw: a vector is in one channel */
            gn_write<TW, TB, TO, VEC>(o + k, v, ch0 + (rank * seg + k) / hw, mean, rstd, w, b);
            /* the store above consumed the element's value: its read is complete before the
               element is overwritten */
            if constexpr (!BULK) { if (next < ng) stage_vec<TX, VEC>(keep + k, an + k); }
        }
        ring_refill<TX, CE, BULK>(keep, bar, an, nc, next < ng);
        for (int k = stash + t * VEC; k < seg; k += CE) {
            float v[VEC];
            load_vec<TX, VEC>(a + k, v);
            gn_write<TW, TB, TO, VEC>(o + k, v, ch0 + (rank * seg + k) / hw, mean, rstd, w, b);
        }
    }
    cluster.sync();  /* no block leaves while another may still read its shared memory */
}
"""


STREAM_KERNEL = r"""
/* Ordered work items (decode_item in the common code): units are groups, the second phase
   normalises a piece AHEAD units after its statistics. */
template <typename TX, typename TW, typename TB, typename TO, typename TS, int THREADS, int VEC, int PIECES, int CHUNK,
          int AHEAD>
__global__ void __launch_bounds__(THREADS)
gn_stream(const TX* __restrict__ x, const TW* __restrict__ w, const TB* __restrict__ b, TO* __restrict__ y,
          TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float* __restrict__ part, unsigned* done,
          unsigned* ticket, int glen, int hw, int groups, int cpg, float eps, int ng, unsigned items) {
    __shared__ unsigned s_item[2];
    __shared__ float stat[2];
    const int t = threadIdx.x, lane = t & 31, wid = t >> 5;
    /* the next item's ticket is taken while this one runs (its atomic's latency off the path) */
    if (t == 0) s_item[0] = atomicAdd(ticket, 1u);
    __syncthreads();
    for (int cur = 0;; cur ^= 1) {
        WorkItem wi;
        if (!take_item<PIECES, AHEAD>(s_item, cur, ticket, items, ng, wi)) return;
        const int g = wi.unit, piece = wi.piece;
        const bool stats = wi.stats;
        if (g < 0) {
            __syncthreads();  /* the next ticket is in s_item[cur ^ 1] for everyone */
            continue;
        }
        const TX* a = x + (int64_t)g * glen + (int64_t)piece * CHUNK;
        if (stats) {
            const float pivot = to_f(x[(int64_t)g * glen]);
            float s1 = 0.f, s2 = 0.f;
#pragma unroll 4
            for (int k = t * VEC; k < CHUNK; k += THREADS * VEC) {
                float v[VEC];
                load_vec<TX, VEC>(a + k, v);
                pivot_add<VEC>(v, pivot, s1, s2);
            }
            float n, mean, m2;
            block_welford<THREADS>((float)(CHUNK / (THREADS * VEC) * VEC), pivot, s1, s2, n, mean, m2);
            if (t == 0) {
                float* q = part + ((int64_t)g * PIECES + piece) * 3;
                q[0] = n; q[1] = mean; q[2] = m2;
                count_piece(done + g);
            }
            __syncthreads();
        } else {
            if (t == 0) wait_pieces(done + g, PIECES);
            __syncthreads();
            if (wid == 0) {
                float n = 0.f, mean = 0.f, m2 = 0.f;
                for (int k = lane; k < PIECES; k += 32) {
                    const float* q = part + ((int64_t)g * PIECES + k) * 3;
                    welford_merge(n, mean, m2, __ldcg(q), __ldcg(q + 1), __ldcg(q + 2));
                }
                welford_warp(n, mean, m2);
                if (lane == 0) publish_stats(n, mean, m2, eps, stat, piece == 0, mean_out, rstd_out, g);
            }
            __syncthreads();
            const float mean = stat[0], rstd = stat[1];
            const int ch0 = (g % groups) * cpg;
            TO* o = y + (int64_t)g * glen + (int64_t)piece * CHUNK;
#pragma unroll 4
            for (int k = t * VEC; k < CHUNK; k += THREADS * VEC) {
                float v[VEC];
                load_vec<TX, VEC>(a + k, v);
                /* VEC divides hw: a vector is in one channel */
                gn_write<TW, TB, TO, VEC>(o + k, v, ch0 + (piece * CHUNK + k) / hw, mean, rstd, w, b);
            }
        }
    }
}
"""


class BatchNorm(Family):
    name = "batch_norm"

    def match(self, card: Card) -> Match | None:
        nodes = card.program.get("nodes") or []
        if len(nodes) != 1 or nodes[0]["op"] not in BN_TARGETS:
            return None
        if card.kind == "op":
            if any(numel(o.shape) for o in card.outputs[1:]):
                return None  # saved statistics would have to be written too
        elif card.outputs and (card.program.get("outputs") != [{"$node": 0, "out": 0}] or len(card.outputs) != 1):
            return None  # a module card (nn.BatchNorm2d) that returns the normalised output alone
        wi_, bi_, mi_, vi_, ti_, ei_ = BN_TARGETS[nodes[0]["op"]]
        a = nodes[0]["args"]
        if ti_ is not None and a[ti_] is not False:
            return None  # training mode
        xi = input_index(a[0])
        idx = [input_index(a[k]) for k in (wi_, bi_, mi_, vi_)]
        if xi is None or idx[2] is None or idx[3] is None:
            return None
        x = card.inputs[xi]
        if x.dtype not in FLOAT_DTYPES or len(x.shape) < 2 or not x.contiguous or not card.outputs[0].contiguous:
            return None
        hw = numel(x.shape[2:])
        return Match(self.name, card, {"x": xi, "w": idx[0], "b": idx[1], "rm": idx[2], "rv": idx[3],
                                       "eps": float(a[ei_]), "n": x.shape[0], "c": x.shape[1], "hw": hw,
                                       "tin": x.dtype, "tout": card.outputs[0].dtype,
                                       "tp": card.inputs[idx[2]].dtype})

    def _vecs(self, m: Match, mode: str = "plane") -> list[int]:
        """The vector widths of a mode: in ``plane`` a vector stays in one (n, c) plane; in
        ``flat`` it may straddle two (each element then finds its own channel)."""
        i = m.info
        n = i["hw"] if mode == "plane" else i["n"] * i["c"] * i["hw"]
        return vec_widths(n, ITEMSIZE[i["tin"]])

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16]}
        return {"mode": ["flat", "plane"], "threads": [128, 256, 512, 1024],
                "vec": sorted(set(self._vecs(m, "flat")) | set(self._vecs(m, "plane")), reverse=True),
                "unroll": [1, 2, 4]}

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        return backend == "cpu" or p["vec"] in self._vecs(m, p.get("mode", "plane"))

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """On the GPU the flat mode first: a block a plane leaves most threads idle and runs
        many short waves where planes are small (ResNet's 14x14 and 7x7: on the H200, 18-30 µs a
        call in place for 6-26 MB, where a copy of the same bytes takes 2-6)."""
        if backend == "cpu":
            return {"chunk": 4}
        return {"mode": "flat", "threads": 256, "vec": self._vecs(m, "flat")[0], "unroll": 2}

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        return header(self.name, p, 1) + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p, device))

    def _param_ptrs(self, m: Match, tp: str) -> str:
        i = m.info
        w = f"(const {tp}*)in[{i['w']}].data" if i["w"] is not None else f"(const {tp}*)nullptr"
        b = f"(const {tp}*)in[{i['b']}].data" if i["b"] is not None else f"(const {tp}*)nullptr"
        return f"{w}, {b}, (const {tp}*)in[{i['rm']}].data, (const {tp}*)in[{i['rv']}].data"

    def _cpu(self, m: Match, p: dict) -> str:
        i, ct = m.info, CPU_CTYPE
        return CPU_COMMON + f'''
typedef {ct[i["tin"]]} TX; typedef {ct[i["tout"]]} TO; typedef {ct[i["tp"]]} TP;
static const int64_t N = {i["n"]}, C = {i["c"]}, HW = {i["hw"]};

static void bn(const TX* x, TO* y, const TP* w, const TP* b, const TP* rm, const TP* rv) {{
#pragma omp parallel for schedule(static, {p["chunk"]}) if(N * C * HW >= PARALLEL_MIN)
    for (int64_t nc = 0; nc < N * C; ++nc) {{
        const int64_t c = nc % C;
        const float invstd = 1.f / std::sqrt(to_f(rv[c]) + (float){i["eps"]!r});
        const float gamma = w ? to_f(w[c]) : 1.f, beta = b ? to_f(b[c]) : 0.f, mean = to_f(rm[c]);
        const TX* a = x + nc * HW;
        TO* o = y + nc * HW;
        for (int64_t k = 0; k < HW; ++k) o[k] = from_f<TO>((to_f(a[k]) - mean) * invstd * gamma + beta);
    }}
}}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[{i["x"]}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    bn((const TX*)in[{i["x"]}].data, (TO*)out[0].data, {self._param_ptrs(m, "TP")});
    return 0;
}}
'''

    def _cuda(self, m: Match, p: dict, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        threads, vec, unroll = p["threads"], p["vec"], p["unroll"]
        params, eps = self._param_ptrs(m, "TP"), f'(float){i["eps"]!r}'
        if p.get("mode", "plane") == "flat":
            total = i["n"] * i["c"] * i["hw"]
            wave = device.sms * (device.max_threads_per_sm // threads)  # blocks resident at once
            grid = min(-(-total // (threads * vec * unroll)), 4 * wave)
            grid1 = min(-(-total // (threads * unroll)), 4 * wave)
            in_plane = "true" if i["hw"] % vec == 0 else "false"
            return self._cuda_entry(m, BN_FLAT_KERNEL, vec, "", (
                f"bn_flat<TX, TO, TP, {threads}, {vec}, {unroll}, C, HW, {in_plane}><<<{grid}, {threads}, 0, s>>>"
                f"(x, y, {params}, N * C * HW, {eps});"), (
                f"bn_flat<TX, TO, TP, {threads}, 1, {unroll}, C, HW, true><<<{grid1}, {threads}, 0, s>>>"
                f"(x, y, {params}, N * C * HW, {eps});"))
        blocks_per_plane = -(-i["hw"] // (threads * vec * unroll))
        return self._cuda_entry(m, BN_KERNEL, vec, f"    dim3 grid((unsigned)(N * C), {blocks_per_plane});\n", (
            f"bn_apply<TX, TO, TP, {threads}, {vec}, {unroll}><<<grid, {threads}, 0, s>>>(x, y, {params}, C, HW, {eps});"), (
            f"bn_apply<TX, TO, TP, {threads}, 1, {unroll}><<<grid, {threads}, 0, s>>>(x, y, {params}, C, HW, {eps});"))

    @staticmethod
    def _cuda_entry(m: Match, kernel: str, vec: int, setup: str, launch: str, scalar_launch: str) -> str:
        """A CUDA batch norm candidate: ``kernel``, then forge_launch checking the card's sizes and
        launching ``launch`` where input and output are aligned to ``vec`` elements, else
        ``scalar_launch``."""
        i, ct = m.info, CTYPE
        return CUDA_COMMON + kernel + f'''
typedef {ct[i["tin"]]} TX; typedef {ct[i["tout"]]} TO; typedef {ct[i["tp"]]} TP;
static const int64_t N = {i["n"]}, C = {i["c"]}, HW = {i["hw"]};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[{i["x"]}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const TX* x = (const TX*)in[{i["x"]}].data;
    TO* y = (TO*)out[0].data;
{setup}    if (forge_aligned(x, {vec} * sizeof(TX)) && forge_aligned(y, {vec} * sizeof(TO)))
        {launch}
    else
        {scalar_launch}
    return (int)cudaGetLastError();
}}
'''

BN_FLAT_KERNEL = r'''
/* The tensor as one flat array, a grid of a few waves striding over it, UNROLL vectors a thread
   loaded before any is written. An element's channel is (index / HW) % C (compile-time constants:
   multiplications); IN_PLANE (VEC divides HW): a vector is in one channel, found once. Eager's
   formula: (x - mean) * invstd * w + b. */
template <typename TP>
__device__ __forceinline__ void bn_coef(const TP* __restrict__ w, const TP* __restrict__ b,
                                        const TP* __restrict__ rm, const TP* __restrict__ rv, int64_t c,
                                        float eps, float& mean, float& invstd, float& gamma, float& beta) {
    mean = to_f(__ldg(rm + c));
    invstd = rsqrtf(to_f(__ldg(rv + c)) + eps);
    gamma = w ? to_f(__ldg(w + c)) : 1.f;
    beta = b ? to_f(__ldg(b + c)) : 0.f;
}

template <typename TX, typename TO, typename TP, int THREADS, int VEC, int UNROLL, int64_t CH, int64_t PLANE,
          bool IN_PLANE>
__global__ void __launch_bounds__(THREADS) bn_flat(const TX* __restrict__ x, TO* __restrict__ y,
                                                   const TP* __restrict__ w, const TP* __restrict__ b,
                                                   const TP* __restrict__ rm, const TP* __restrict__ rv,
                                                   int64_t total, float eps) {
    const int64_t step = (int64_t)gridDim.x * THREADS * VEC * UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * THREADS * VEC * UNROLL; base < total; base += step) {
        float v[UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
            if (k < total) load_vec<TX, VEC>(x + k, v[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
            if (k >= total) continue;
            float mean, invstd, gamma, beta;
            if (IN_PLANE) bn_coef(w, b, rm, rv, (k / PLANE) % CH, eps, mean, invstd, gamma, beta);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                if (!IN_PLANE) bn_coef(w, b, rm, rv, ((k + j) / PLANE) % CH, eps, mean, invstd, gamma, beta);
                v[u][j] = (v[u][j] - mean) * invstd * gamma + beta;
            }
            store_vec<TO, VEC>(y + k, v[u]);
        }
    }
}
'''


BN_KERNEL = r'''
/* grid.x = one (n, c) plane, grid.y = pieces of it; eager's formula: (x - mean) * invstd * w + b. */
template <typename TX, typename TO, typename TP, int THREADS, int VEC, int UNROLL>
__global__ void __launch_bounds__(THREADS) bn_apply(const TX* __restrict__ x, TO* __restrict__ y,
                                                    const TP* __restrict__ w, const TP* __restrict__ b,
                                                    const TP* __restrict__ rm, const TP* __restrict__ rv,
                                                    int64_t channels, int64_t hw, float eps) {
    const int64_t plane = blockIdx.x;
    const int64_t c = plane % channels;
    const float invstd = rsqrtf(to_f(rv[c]) + eps);
    const float gamma = w ? to_f(w[c]) : 1.f, beta = b ? to_f(b[c]) : 0.f, mean = to_f(rm[c]);
    const TX* a = x + plane * hw;
    TO* o = y + plane * hw;
    const int64_t base = (int64_t)blockIdx.y * THREADS * VEC * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
        if (k < hw) {
            float v[VEC];
            load_vec<TX, VEC>(a + k, v);
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = (v[j] - mean) * invstd * gamma + beta;
            store_vec<TO, VEC>(o + k, v);
        }
    }
}
'''
