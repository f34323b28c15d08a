/* The generated CUDA kernels' device code (forge_tui/codegen/emit_cuda): the prelude every
   kernel starts with, around the shared helpers (kernels/scalar_helpers.h, fast_math.cuh), and
   the tiles grid's helpers. */

//@section head

#include <cooperative_groups.h>
#define FG __device__ __forceinline__
FG float fg_rbf(float v) { return round_to<__nv_bfloat16>(v); }
FG float fg_rh(float v) { return round_to<__half>(v); }
FG float fg_rsqrt(float v) { return rsqrtf(v); }
//@section tail

template <int OP> FG float fg_comb(float a, float b) { return OP == 0 ? a + b : OP == 1 ? fg_max_acc(a, b) : fg_min_acc(a, b); }
template <int OP> FG float fg_ident() { return OP == 0 ? 0.f : OP == 1 ? -INFINITY : INFINITY; }

/* Reduce over the TPR threads of a row (rows side by side in the block, TPR a power of two; below
   32 a warp holds 32 / TPR rows). Every thread of the block calls it. scratch: RPB * (TPR / 32). */
template <int TPR, int OP>
FG float fg_row_reduce(float v, float* scratch) {
    constexpr int LANES = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v = fg_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (TPR > 32) {
        constexpr int W = TPR / 32;
        const int lane = threadIdx.x & 31, w = (threadIdx.x % TPR) >> 5, slot = threadIdx.x / TPR;
        __syncthreads();
        if (lane == 0) scratch[slot * W + w] = v;
        __syncthreads();
        v = lane < W ? scratch[slot * W + lane] : fg_ident<OP>();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fg_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* A row split over a cluster (SPLIT > 1): each block's partial result of a reduction, written to
   its own slot, read from every block of the cluster in rank order after a cluster barrier. */
template <int OP> FG float fg_cluster_comb(float* part, int split) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    float v = fg_ident<OP>();
    for (int r = 0; r < split; ++r) v = fg_comb<OP>(v, *cl.map_shared_rank(part, r));
    return v;
}
FG void fg_cluster_sync() { cooperative_groups::this_cluster().sync(); }

template <typename T, int N> FG void fg_vec_to_f(const Vec<T, N>& a, float (&out)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(a.v[j]);
}
//@section tiles

#define PIX (NSTEP * TPB * VEC / PER)

/* A vector's elements, one access where aligned (AL), else one by one; and its store. */
template <typename T, int N, bool AL> FG Vec<T, N> fg_raw(const T* __restrict__ p) {
    if constexpr (AL) {
        return *reinterpret_cast<const Vec<T, N>*>(p);
    } else {
        Vec<T, N> a;
#pragma unroll
        for (int j = 0; j < N; ++j) a.v[j] = p[j];
        return a;
    }
}
template <typename T, int N, bool AL> FG void fg_st(T* __restrict__ p, const float (&in)[N]) {
    if constexpr (AL) {
        store_vec<T, N>(p, in);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = from_f<T>(in[j]);
    }
}

/* The block's share of each row: thread q < NR combines, in thread order, the values of the
   block's threads of row q (runs q, q + NR, ... of RL / VEC threads) into ws[blockIdx.x * NR + q]. */
template <int OP> FG void fg_tile_block(float v, float* red, float* ws) {
    const int t = threadIdx.x;
    constexpr int TR = RL / VEC;
    red[t] = v;
    __syncthreads();
    if (t < NR) {
        float a = fg_ident<OP>();
        for (int k = 0; k < TPB * VEC / PER; ++k)
#pragma unroll
            for (int i = 0; i < TR; ++i) a = fg_comb<OP>(a, red[(t + k * NR) * TR + i]);
        ws[(int64_t)blockIdx.x * NR + t] = a;
    }
    __syncthreads();
}

/* After the grid barrier, in every block alike: thread t combines row t % NR's results of blocks
   t / NR, t / NR + TPB / NR, ..., then thread q < NR those of threads q, q + NR, ... in order. */
template <int OP> FG void fg_tile_grid(const float* ws, float* red, float* tot) {
    const int t = threadIdx.x;
    constexpr int W = TPB / NR;
    float a = fg_ident<OP>();
#pragma unroll 8
    for (int b = t / NR; b < BLOCKS; b += W) a = fg_comb<OP>(a, __ldcg(ws + (int64_t)b * NR + t % NR));
    red[t] = a;
    __syncthreads();
    if (t < NR) {
        float v = fg_ident<OP>();
        for (int i = 0; i < W; ++i) v = fg_comb<OP>(v, red[i * NR + t]);
        tot[t] = v;
    }
    __syncthreads();
}
