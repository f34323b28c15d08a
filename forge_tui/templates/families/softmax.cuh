/* softmax's device code (forge_tui/templates/families/softmax.py): every mode's kernel, reading
   input row r at XROW(r) (softmax_rows.h). */

//@section kernels

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
