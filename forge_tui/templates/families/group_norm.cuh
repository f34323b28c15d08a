/* group_norm's device code (forge_tui/templates/families/group_norm.py): the statistics and
   normalisation shared by every mode, then each one-pass mode's kernel. */

//@section kernels

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
//@section stash

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
//@section ring

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
//@section stream

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
