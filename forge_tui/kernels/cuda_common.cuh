/* Device code every CUDA candidate starts with (forge_tui/kernels/common.py): dtype conversion,
   vector loads and stores, warp and row reductions, asynchronous and bulk copies for the ring
   modes, and the ordered work items of the stream modes. */

//@section common

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "forge_kernel.h"

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
/* Round a float to T's precision and back (emulates eager rounding between ops). */
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_f(from_f<T>(v)); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&out)[N]) {
    Vec<T, N> a = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(a.v[j]);
}

/* One store instruction of the vector's width: left to itself the compiler sometimes splits a
   16-byte struct store into four 4-byte stores (seen in the PTX of loops with unrolled
   remainders), each of which the L2 then merges; on the H200 that made a store phase 2.4x
   slower. No "memory" clobber: outputs are never read back by the kernel that writes them, and
   later loads stay free to move ahead of the store. */
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const float (&in)[N]) {
    Vec<T, N> a;
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = from_f<T>(in[j]);
    constexpr int B = (int)sizeof(Vec<T, N>);
    if constexpr (B % 16 == 0) {  /* 16 bytes an instruction (32 when a narrow input widens) */
#pragma unroll
        for (int k = 0; k < B / 16; ++k) {
            uint4 u;
            memcpy(&u, reinterpret_cast<const char*>(&a) + 16 * k, 16);
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                         :: "l"(reinterpret_cast<char*>(p) + 16 * k), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w));
        }
    } else if constexpr (B == 8) {
        uint2 u;
        memcpy(&u, &a, 8);
        asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(p), "r"(u.x), "r"(u.y));
    } else {
        *reinterpret_cast<Vec<T, N>*>(p) = a;
    }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Reduce over the TPR threads that share a row (TPR a multiple of 32, rows side by side in the
   block). Every thread of the block must call it. scratch: ROWS * (TPR / 32) floats. */
template <int TPR, bool MAX>
__device__ __forceinline__ float row_reduce(float v, float* scratch) {
    v = MAX ? warp_max(v) : warp_sum(v);
    if constexpr (TPR > 32) {
        constexpr int W = TPR / 32;
        const int lane = threadIdx.x & 31, w = (threadIdx.x % TPR) >> 5, r = threadIdx.x / TPR;
        __syncthreads();
        if (lane == 0) scratch[r * W + w] = v;
        __syncthreads();
        v = lane < W ? scratch[r * W + lane] : (MAX ? -INFINITY : 0.f);
        v = MAX ? warp_max(v) : warp_sum(v);
    }
    return v;
}

/* Asynchronous copies from global to shared memory (sm_80+), for the ring modes. A thread stages
   a vector into a slot of its own and only it reads the slot back: after stage_wait() the data is
   visible to it, with no barrier. Vectors of 4, 8 or 16 bytes go by cp.async, others by a plain
   copy. The "memory" clobbers keep the compiler from moving shared-memory reads across them. */
template <typename T, int N>
__device__ __forceinline__ void stage_vec(T* dst, const T* __restrict__ src) {
    constexpr int B = (int)sizeof(T) * N;
    if constexpr (B == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
    } else if constexpr (B == 8 || B == 4) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n"
                     :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "n"(B) : "memory");
    } else {
        *reinterpret_cast<Vec<T, N>*>(dst) = *reinterpret_cast<const Vec<T, N>*>(src);
    }
}
__device__ __forceinline__ void stage_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void stage_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* Bulk asynchronous copies (sm_90, one-dimensional TMA), for the ring modes: one thread moves a
   whole chunk from global to shared memory and its bytes are counted on an mbarrier (one per
   chunk, one arrival a phase) that the chunk's readers wait on with the phase's parity. Sizes and
   addresses are multiples of 16 bytes. Before a chunk that threads have read is refilled, a block
   barrier and then proxy_fence() (by the issuing thread) order those reads before the copy. */
#define RING_MAX_CHUNKS 64
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bulk_wait(uint64_t* bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}

/* The ring modes' loads into a block's stash: NC chunks of CE = THREADS * VEC elements, thread
   t's element of chunk c at c * CE + t * VEC. ring_start loads the first unit's chunks (BULK:
   thread 0 sets up the chunks' mbarriers and issues one bulk copy a chunk; otherwise each thread
   stages its own elements); ring_refill, once every thread has read every chunk, requests the
   next unit's (BULK only: without it, threads stage their elements as they use them). Every
   thread of the block calls both. */
template <typename T, int VEC, int CE, bool BULK>
__device__ __forceinline__ void ring_start(T* keep, uint64_t* bar, const T* src, int nc, int stash, bool live) {
    if constexpr (BULK) {
        if (threadIdx.x == 0) {
            for (int c = 0; c < nc; ++c) bar_init(&bar[c]);
            bar_init_fence();
            for (int c = 0; c < nc && live; ++c) bulk_load(keep + c * CE, src + c * CE, CE * sizeof(T), &bar[c]);
        }
        __syncthreads();
    } else {
        for (int k = threadIdx.x * VEC; k < stash && live; k += CE) stage_vec<T, VEC>(keep + k, src + k);
        stage_commit();
    }
}

template <typename T, int CE, bool BULK>
__device__ __forceinline__ void ring_refill(T* keep, uint64_t* bar, const T* src, int nc, bool live) {
    if constexpr (BULK) {
        __syncthreads();  /* every thread has read every chunk */
        if (threadIdx.x == 0 && live) {
            proxy_fence();
            for (int c = 0; c < nc; ++c) bulk_load(keep + c * CE, src + c * CE, CE * sizeof(T), &bar[c]);
        }
    } else {
        stage_commit();
    }
}

static inline bool forge_aligned(const void* p, int bytes) { return ((uintptr_t)p % bytes) == 0; }

/* Ordered work items for one-launch, two-phase kernels (the stream modes). Item t, taken in order
   from a ticket counter, is in round r = t / (2 * PIECES): even items are the statistics of piece
   (t % (2 * PIECES)) / 2 of unit r, odd ones the second phase of that piece of unit r - AHEAD,
   which waits until its unit's PIECES statistics items are counted. Those were all ticketed
   earlier by running blocks, so the lowest unfinished item can always finish: no deadlock,
   whatever the residency. A block takes its next ticket while the current item runs. */
struct WorkItem { int unit, piece; bool stats; };

template <int PIECES, int AHEAD>
__device__ __forceinline__ WorkItem decode_item(unsigned item) {
    const int round = (int)(item / (2 * PIECES));
    WorkItem w;
    w.piece = (int)((item % (2 * PIECES)) / 2);
    w.stats = (item & 1u) == 0u;
    w.unit = w.stats ? round : round - AHEAD;
    return w;
}

/* A stream-mode block's next work item: the ticket taken last time is in s_item[cur], and thread 0
   takes the following one into s_item[cur ^ 1] while this item runs (the atomic's latency off the
   path). False once the items are used up; wi.unit is -1 for an item outside [0, units), for which
   the block only meets at a barrier (so the next ticket is visible to all) and goes on. */
template <int PIECES, int AHEAD>
__device__ __forceinline__ bool take_item(unsigned* s_item, int cur, unsigned* ticket, unsigned items, int units,
                                          WorkItem& wi) {
    const unsigned item = s_item[cur];
    if (threadIdx.x == 0) s_item[cur ^ 1] = atomicAdd(ticket, 1u);
    if (item >= items) return false;
    wi = decode_item<PIECES, AHEAD>(item);
    if (wi.unit < 0 || wi.unit >= units) wi.unit = -1;
    return true;
}

/* Thread 0 only: publish this block's writes, then count one finished piece of the unit. */
__device__ __forceinline__ void count_piece(unsigned* done) {
    __threadfence();
    atomicAdd(done, 1u);
}

/* Thread 0 only: wait until n pieces of the unit are counted; their writes are then visible
   (read them with __ldcg, past L1). */
__device__ __forceinline__ void wait_pieces(unsigned* done, unsigned n) {
    while (atomicAdd(done, 0u) < n) __nanosleep(64);
    __threadfence();
}
