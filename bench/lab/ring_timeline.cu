// Answers: where does a persistent-cluster ("ring") group_norm spend its time on the H200, phase by
// phase and round by round, next to the non-persistent stash mode and a device copy of the same
// bytes? A standalone microbenchmark, not a template: a cluster of 8 blocks per group, each block's
// eighth of the group in shared memory, the next group's loads overlapping this group's stores; the
// device clock is stamped at each phase of each round. What it found: docs/runs/issue-05-run-e.md.
//
//   python bench/lab/render_gn_stash.py /tmp/gn.cu
//   nvcc -O3 -arch=sm_90 -std=c++17 -I forge_tui/abi -DPRODUCT_STASH='"/tmp/gn.cu"' \
//        -o /tmp/ring_timeline bench/lab/ring_timeline.cu && /tmp/ring_timeline
//
// Shape: group_norm fp32 (2, 512, 128, 128), 32 groups: 64 groups of 1 MB, no affine. Times are
// medians of 20 runs, a 256 MB write before each (then, a second time, with a 300 us GPU spin
// between that write and the timed launch, as forge's timer does). Rows:
//   the device copy of the same bytes; the template's own stash through forge_launch (with
//   -DPRODUCT_STASH); 15 MB stored or loaded by 120 blocks, each at its own base or all stepping
//   through one window; the stash mode written here, with the compiler's stores and with
//   one-instruction 16-byte stores; and these persistent ring variants, each with a per-round
//   timeline (data in, statistics merged, stored; microseconds from the first block's start):
//   0 per-thread cp.async of the next group's slot as each slot is stored
//   1 per-thread cp.async of the next group issued after all stores of this one
//   2 one thread's bulk copies (TMA) after a block barrier
//   3 persistent, no overlap: plain loads into shared memory at the start of each round
//   4 as 0, a cluster's blocks interleaved by 16 KB chunks
//   0-3 again with one-instruction stores.
#ifdef PRODUCT_STASH
/* the template's own stash mode for this card (python bench/lab/render_gn_stash.py FILE), timed in
   this harness next to the kernels below */
#include PRODUCT_STASH
#endif
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>

namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int CL = 8, THREADS = 1024, VEC = 4, GLEN = 16 * 128 * 128, NG = 64, SEG = GLEN / CL;
constexpr int CE = THREADS * VEC, NC = SEG / CE, MAXR = 8;

__device__ __forceinline__ uint64_t now() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned su32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void* d, const void* s) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(su32(d)), "l"(s) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(uint64_t* b) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(su32(b)) : "memory"); }
__device__ __forceinline__ void mbulk(void* d, const void* s, unsigned n, uint64_t* b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(su32(b)), "r"(n) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(su32(d)), "l"(s), "r"(n), "r"(su32(b)) : "memory");
}
__device__ __forceinline__ void mbulk_wait(uint64_t* b, unsigned par) {
    unsigned done = 0;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(su32(b)), "r"(par) : "memory");
    } while (!done);
}

/* A 16-byte store as one instruction (STV=true: st.global.v4.f32 by inline PTX, which nvcc cannot
   split into 4-byte stores), or the plain C++ float4 store (STV=false), to compare the two. */
template <bool STV>
__device__ __forceinline__ void st4(float* p, float4 v) {
    if (STV) asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w));
    else *reinterpret_cast<float4*>(p) = v;
}

template <int THR>
__device__ float block_sum(float v, float* sc) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < THR / 32 ? sc[threadIdx.x & 31] : 0.f;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    return v;
}

/* Statistics as sum and sum of squares (enough for timing), merged over the cluster. */
/* Element k of block `rank`'s share (k = slot * CE + t * VEC): contiguous segments (block r owns
   [r * SEG, (r + 1) * SEG)), or with IL its chunks of CE elements interleaved with the other
   blocks' (chunk c of the share is chunk c * CL + r of the group), so that at any moment a
   cluster's blocks touch neighbouring chunks, not addresses SEG apart. */
template <bool IL>
__device__ __forceinline__ int64_t gpos(int rank, int k) {
    return IL ? ((int64_t)(k / CE) * CL + rank) * CE + k % CE : (int64_t)rank * SEG + k;
}

template <int MODE, bool STV>
__global__ void __launch_bounds__(THREADS) ring(const float* __restrict__ x, float* __restrict__ y, uint64_t* tl) {
    cg::cluster_group cluster = cg::this_cluster();
    extern __shared__ __align__(16) float keep[];
    __shared__ __align__(8) uint64_t bar[NC];
    __shared__ float part[2][2], sc[32], stat[2];
    const int rank = (int)cluster.block_rank(), clusters = gridDim.x / CL, cid = blockIdx.x / CL, t = threadIdx.x;
    constexpr bool IL = MODE == 4;
    uint64_t* my = tl + (int64_t)blockIdx.x * (1 + 3 * MAXR);
    if (t == 0) my[0] = now();
    if (MODE == 2) {
        if (t == 0) {
            for (int c = 0; c < NC; ++c) mbar_init(&bar[c]);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            for (int c = 0; c < NC; ++c) mbulk(keep + c * CE, x + (int64_t)cid * GLEN + gpos<IL>(rank, c * CE), CE * 4, &bar[c]);
        }
        __syncthreads();
    } else if (MODE != 3) {
        for (int k = t * VEC; k < SEG; k += CE) cp16(keep + k, x + (int64_t)cid * GLEN + gpos<IL>(rank, k));
        cp_commit();
    }
    int round = 0, r = 0;
    for (int g = cid; g < NG; g += clusters, round ^= 1, ++r) {
        const float* a = x + (int64_t)g * GLEN;
        float* o = y + (int64_t)g * GLEN;
        if (MODE == 3) {
            for (int k = t * VEC; k < SEG; k += CE) *reinterpret_cast<float4*>(keep + k) = *reinterpret_cast<const float4*>(a + gpos<IL>(rank, k));
        } else if (MODE != 2) {
            cp_wait();
        }
        float s1 = 0.f, s2 = 0.f;
        for (int c = 0; c < NC; ++c) {
            if (MODE == 2) mbulk_wait(&bar[c], (unsigned)round);
            const float4 v = *reinterpret_cast<const float4*>(keep + c * CE + t * VEC);
            s1 += v.x + v.y + v.z + v.w;
            s2 += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        if (t == 0 && r < MAXR) my[1 + 3 * r] = now();
        s1 = block_sum<THREADS>(s1, sc);
        s2 = block_sum<THREADS>(s2, sc);
        if (t == 0) { part[round][0] = s1; part[round][1] = s2; }
        cluster.sync();
        if (t == 0) {
            float a1 = 0.f, a2 = 0.f;
            for (int q = 0; q < CL; ++q) { const float* p = cluster.map_shared_rank(part[round], q); a1 += p[0]; a2 += p[1]; }
            const float mean = a1 / GLEN;
            stat[0] = mean;
            stat[1] = rsqrtf(fmaxf(a2 / GLEN - mean * mean, 0.f) + 1e-5f);
        }
        __syncthreads();
        if (t == 0 && r < MAXR) my[2 + 3 * r] = now();
        const float mean = stat[0], rstd = stat[1];
        const int next = g + clusters;
        const float* an = x + (int64_t)next * GLEN;
#pragma unroll 4
        for (int k = t * VEC; k < SEG; k += CE) {
            float4 v = *reinterpret_cast<const float4*>(keep + k);
            v.x = (v.x - mean) * rstd; v.y = (v.y - mean) * rstd; v.z = (v.z - mean) * rstd; v.w = (v.w - mean) * rstd;
            st4<STV>(o + gpos<IL>(rank, k), v);
            if ((MODE == 0 || MODE == 4) && next < NG) cp16(keep + k, an + gpos<IL>(rank, k));
        }
        if (MODE == 1 && next < NG) for (int k = t * VEC; k < SEG; k += CE) cp16(keep + k, an + gpos<IL>(rank, k));
        if (MODE != 2 && MODE != 3) cp_commit();
        if (MODE == 2) {
            __syncthreads();
            if (t == 0 && next < NG) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                for (int c = 0; c < NC; ++c) mbulk(keep + c * CE, an + gpos<IL>(rank, c * CE), CE * 4, &bar[c]);
            }
        }
        if (MODE == 3) __syncthreads();
        if (t == 0 && r < MAXR) my[3 + 3 * r] = now();
    }
    cluster.sync();
}

/* The stash mode as the template has it (minus the affine and the pivot): a group a cluster.
   Bisection against the template's own kernel: PAR merges the cluster's partials in warp 0's
   lanes at once (the template's way) instead of thread 0 reading them one after another; FMA
   normalises with one multiply-add (scale, shift) as the template does. */
template <bool PAR, bool FMA, bool STV>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS) stash(const float* __restrict__ x, float* __restrict__ y, int st) {
    cg::cluster_group cluster = cg::this_cluster();
    extern __shared__ __align__(16) float keep[];
    __shared__ float part[2], sc[32], stat[2];
    const int rank = (int)cluster.block_rank(), t = threadIdx.x;
    const int64_t g = blockIdx.x / CL;
    const float* a = x + g * GLEN + (int64_t)rank * SEG;
    float* o = y + g * GLEN + (int64_t)rank * SEG;
    float s1 = 0.f, s2 = 0.f;
#pragma unroll 4
    for (int k = t * VEC; k < SEG; k += CE) {
        const float4 v = *reinterpret_cast<const float4*>(a + k);
        if (k < st) *reinterpret_cast<float4*>(keep + k) = v;
        s1 += v.x + v.y + v.z + v.w;
        s2 += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s1 = block_sum<THREADS>(s1, sc);
    s2 = block_sum<THREADS>(s2, sc);
    if (t == 0) { part[0] = s1; part[1] = s2; }
    cluster.sync();
    if (PAR) {
        if (t < 32) {
            float a1 = 0.f, a2 = 0.f;
            if (t < CL) { const float* p = cluster.map_shared_rank(part, t); a1 = p[0]; a2 = p[1]; }
            for (int o = 16; o; o >>= 1) { a1 += __shfl_xor_sync(~0u, a1, o); a2 += __shfl_xor_sync(~0u, a2, o); }
            if (t == 0) {
                stat[0] = a1 / GLEN;
                stat[1] = rsqrtf(fmaxf(a2 / GLEN - stat[0] * stat[0], 0.f) + 1e-5f);
            }
        }
    } else if (t == 0) {
        float a1 = 0.f, a2 = 0.f;
        for (int q = 0; q < CL; ++q) { const float* p = cluster.map_shared_rank(part, q); a1 += p[0]; a2 += p[1]; }
        stat[0] = a1 / GLEN;
        stat[1] = rsqrtf(fmaxf(a2 / GLEN - stat[0] * stat[0], 0.f) + 1e-5f);
    }
    __syncthreads();
    const float mean = stat[0], rstd = stat[1], shift = -mean * rstd;
#pragma unroll 4
    for (int k = t * VEC; k < SEG; k += CE) {
        float4 v = k < st ? *reinterpret_cast<const float4*>(keep + k) : *reinterpret_cast<const float4*>(a + k);
        if (FMA) { v.x = fmaf(v.x, rstd, shift); v.y = fmaf(v.y, rstd, shift); v.z = fmaf(v.z, rstd, shift); v.w = fmaf(v.w, rstd, shift); }
        else { v.x = (v.x - mean) * rstd; v.y = (v.y - mean) * rstd; v.z = (v.z - mean) * rstd; v.w = (v.w - mean) * rstd; }
        st4<STV>(o + k, v);
    }
    cluster.sync();
}

/* Bytes moved in the ring's pattern: 120 blocks, each 128 KB at its own base (BLOCKWISE), or the
   same bytes with all blocks stepping through one contiguous window together. */
template <bool BLOCKWISE, bool STORE>
__global__ void __launch_bounds__(THREADS) pattern(float* __restrict__ p, int blocks) {
    const bool varied = blocks < 0;  /* store values that differ everywhere, not a constant pattern */
    blocks = blocks < 0 ? -blocks : blocks;
    float acc = 0.f;
    for (int j = 0; j < SEG / CE; ++j) {
        const int64_t e = BLOCKWISE ? (int64_t)blockIdx.x * SEG + j * CE + threadIdx.x * VEC
                                    : ((int64_t)j * blocks + blockIdx.x) * CE + threadIdx.x * VEC;
        if (STORE && varied) {
            const float f = (float)(((uint32_t)e * 2654435761u) >> 8);
            *reinterpret_cast<float4*>(p + e) = make_float4(f, f * 1.5f, f * 0.25f, f + 3.f);
        } else if (STORE) *reinterpret_cast<float4*>(p + e) = make_float4(1.f, 2.f, 3.f, (float)j);
        else { const float4 v = *reinterpret_cast<const float4*>(p + e); acc += v.x + v.y + v.z + v.w; }
    }
    if (!STORE && acc == 1234.5f) p[0] = acc;
}

__global__ void spin(int64_t ns) { const uint64_t t0 = now(); while (now() - t0 < (uint64_t)ns) {} }

__global__ void fill(float* p, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = (float)(h & 0xffffff) / 16777216.f * 4.f - 2.f + (float)(i / GLEN % 7);
    }
}

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
    const int64_t n = (int64_t)NG * GLEN;
    float *x, *y, *flush;
    uint64_t* tl;
    const int64_t fl = 256ll << 20;
    CK(cudaMalloc(&x, n * 4)); CK(cudaMalloc(&y, n * 4)); CK(cudaMalloc(&flush, fl));
    const int tl_words = 264 * (1 + 3 * MAXR);
    CK(cudaMalloc(&tl, tl_words * 8));
    fill<<<1024, 256>>>(x, n);
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int smem = SEG * 4;
    printf("%-58s %8s %9s\n", "variant", "median us", "TB/s");
    bool shield = false;  /* a 300 us GPU spin between the flush and the timed launch, as forge's timer does */
    auto time = [&](const char* name, auto launch) {
        std::vector<float> ts;
        for (int i = 0; i < 23; ++i) {
            CK(cudaMemsetAsync(flush, i, fl));
            if (shield) spin<<<1, 1>>>(300000);
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 3) ts.push_back(ms * 1000.f);
        }
        const float us = median(ts);
        printf("%-58s %8.1f %9.2f\n", name, us, 2.0 * n * 4 / (us * 1e-6) / 1e12);
        return us;
    };
  for (int sh = 0; sh < 2; ++sh) {
    shield = sh == 1;
    printf("--- %s\n", shield ? "300 us spin between the flush and the timed launch" : "timed launch right after the flush");
    time("device copy of the same bytes", [&] { CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice)); });
#ifdef PRODUCT_STASH
    {
        float *w, *b, *mo, *ro;
        CK(cudaMalloc(&w, 512 * 4)); CK(cudaMalloc(&b, 512 * 4)); CK(cudaMalloc(&mo, 64 * 4)); CK(cudaMalloc(&ro, 64 * 4));
        fill<<<1, 512>>>(w, 512);
        fill<<<1, 512>>>(b, 512);
        forge_tensor in[3] = {}, out[3] = {};
        auto desc = [](forge_tensor& d, void* p, std::vector<int64_t> shape) {
            d.data = p; d.dtype = FORGE_FLOAT32; d.ndim = (int32_t)shape.size();
            int64_t st = 1;
            for (int k = d.ndim - 1; k >= 0; --k) { d.shape[k] = shape[k]; d.stride[k] = st; st *= shape[k]; }
        };
        desc(in[0], x, {2, 512, 128, 128}); desc(in[1], w, {512}); desc(in[2], b, {512});
        desc(out[0], y, {2, 512, 128, 128}); desc(out[1], mo, {2, 32}); desc(out[2], ro, {2, 32});
        time("the template's stash mode (forge_launch)", [&] {
            const int rc = forge_launch(in, 3, out, 3, nullptr, 0, nullptr);
            if (rc) { printf("forge_launch returned %d\n", rc); exit(1); }
        });
    }
#endif
    time("store 15 MB of varied values: 120 blocks x 128 KB each", [&] { pattern<true, true><<<120, THREADS>>>(y, -120); });
    time("store 15 MB: 120 blocks x 128 KB, each at its own base", [&] { pattern<true, true><<<120, THREADS>>>(y, 120); });
    time("store 15 MB: 120 blocks stepping through one window", [&] { pattern<false, true><<<120, THREADS>>>(y, 120); });
    time("load 15 MB: 120 blocks x 128 KB, each at its own base", [&] { pattern<true, false><<<120, THREADS>>>(x, 120); });
    time("load 15 MB: 120 blocks stepping through one window", [&] { pattern<false, false><<<120, THREADS>>>(x, 120); });
    for (int st : {SEG, 79 * 1024 / 4 / CE * CE}) {
        const int sm = st * 4, dyn = st == SEG ? smem : 80 * 1024 - 1024;
        void (*ks[])(const float*, float*, int) = {stash<false, false, false>, stash<true, true, false>,
                                                   stash<false, false, true>, stash<true, true, true>};
        const char* what[] = {"", ", parallel merge, FMA", ", one-instruction stores", ", parallel merge, FMA, one-instruction stores"};
        for (int v = 0; v < 4; ++v) {
            if (shield && v) continue;
            CK(cudaFuncSetAttribute(ks[v], cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
            char name[120];
            snprintf(name, sizeof name, "stash, %d KB in smem%s%s", sm / 1024, st == SEG ? " (1 block/SM)" : " (2 blocks/SM)", what[v]);
            time(name, [&] { ks[v]<<<NG * CL, THREADS, dyn>>>(x, y, st); });
        }
    }
    const char* names[] = {"ring: cp.async of a slot as it is stored", "ring: cp.async after all stores",
                           "ring: bulk copies (TMA) after a barrier", "persistent, no overlap (plain loads each round)",
                           "ring as 0, a cluster's blocks interleaved by 16 KB chunks",
                           "ring 0, one-instruction stores", "ring 1, one-instruction stores",
                           "ring 2, one-instruction stores", "ring 3, one-instruction stores"};
    void (*kernels[])(const float*, float*, uint64_t*) = {ring<0, false>, ring<1, false>, ring<2, false>, ring<3, false>,
                                                          ring<4, false>, ring<0, true>, ring<1, true>, ring<2, true>,
                                                          ring<3, true>};
    for (int v = 0; v < 9; ++v) {
        if (shield) continue;
        CK(cudaFuncSetAttribute(kernels[v], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = CL; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(CL); cfg.blockDim = dim3(THREADS); cfg.dynamicSmemBytes = smem; cfg.attrs = attr; cfg.numAttrs = 1;
        int fit = 0;
        CK(cudaOccupancyMaxActiveClusters(&fit, kernels[v], &cfg));
        cfg.gridDim = dim3(CL * std::min(fit, NG));
        time(names[v], [&] { CK(cudaLaunchKernelEx(&cfg, kernels[v], (const float*)x, y, tl)); });
        /* one more run for the timeline */
        CK(cudaMemsetAsync(flush, 7, fl));
        CK(cudaMemsetAsync(tl, 0, tl_words * 8));
        CK(cudaLaunchKernelEx(&cfg, kernels[v], (const float*)x, y, tl));
        CK(cudaDeviceSynchronize());
        std::vector<uint64_t> h(tl_words);
        CK(cudaMemcpy(h.data(), tl, tl_words * 8, cudaMemcpyDeviceToHost));
        const int blocks = CL * std::min(fit, NG), rounds = (NG + fit - 1) / fit;
        uint64_t t0 = ~0ull;
        for (int b = 0; b < blocks; ++b) t0 = std::min(t0, h[b * (1 + 3 * MAXR)]);
        printf("   %d clusters; per round, mean over blocks (us from the first block's start): "
               "data in / stats merged / stored\n", fit);
        for (int r = 0; r < rounds && r < MAXR; ++r) {
            double a = 0, s = 0, c = 0; int k = 0;
            for (int b = 0; b < blocks; ++b) {
                const uint64_t* m = &h[b * (1 + 3 * MAXR)];
                if (!m[3 + 3 * r]) continue;
                a += (m[1 + 3 * r] - t0) / 1e3; s += (m[2 + 3 * r] - t0) / 1e3; c += (m[3 + 3 * r] - t0) / 1e3; ++k;
            }
            if (k) printf("   round %d (%3d blocks): %7.1f %7.1f %7.1f\n", r, k, a / k, s / k, c / k);
        }
        double first = 0; int kb = 0;
        for (int b = 0; b < blocks; ++b) { first += (h[b * (1 + 3 * MAXR)] - t0) / 1e3; ++kb; }
        printf("   blocks started %.1f us after the first, on average\n", first / kb);
    }
  }
    return 0;
}
