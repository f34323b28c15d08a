// Answers: what keeps the generated pointwise kernels of issue 17's two large cards below 85% of a
// same-size copy on the H200 (the SiLU gate at 4x1024x11008, 81-87%; the HF rotary at 4x32x1024x128,
// 71-86%), and which one-axis change would close it: several vectors a thread (unroll), streaming
// cache hints (ld.global.cs / st.global.cs), a persistent grid; for the rotary, loading each
// rotate-half partner once (a thread writes both halves of its columns) or loading only the branch
// a column-uniform select takes, against the generator's current code (three loads of x a column).
//
// Each kernel is timed cold (a 256 MiB write flushes L2 before every sample), one launch between
// CUDA events, median of 40, against torch's copy of the same bytes (cudaMemcpyAsync and a 16-byte
// vector copy). Every variant's output is compared with the baseline's, bit for bit.
//
// Run (GPU machine): nvcc -O3 -arch=sm_90 -std=c++17 bench/lab/pointwise_probe.cu -o /tmp/pwp && /tmp/pwp [OUT.json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

typedef __nv_bfloat16 bf;
struct alignas(16) V8 { bf v[8]; };

__device__ __forceinline__ float rb(float x) { return __bfloat162float(__float2bfloat16(x)); }

template <bool CS> __device__ __forceinline__ V8 ld(const bf* p) {
    if constexpr (CS) { int4 t = __ldcs(reinterpret_cast<const int4*>(p)); return *reinterpret_cast<V8*>(&t); }
    else return *reinterpret_cast<const V8*>(p);
}
template <bool CS> __device__ __forceinline__ void st(bf* p, const V8& v) {
    if constexpr (CS) __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
    else *reinterpret_cast<V8*>(p) = v;
}

// ---- copy -------------------------------------------------------------------------------------
template <int U>
__global__ void copy_k(const int4* __restrict__ a, int4* __restrict__ b, int64_t n) {
    int64_t base = ((int64_t)blockIdx.x * U) * blockDim.x + threadIdx.x;
    int4 t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { int64_t i = base + (int64_t)u * blockDim.x; if (i < n) t[u] = a[i]; }
#pragma unroll
    for (int u = 0; u < U; ++u) { int64_t i = base + (int64_t)u * blockDim.x; if (i < n) b[i] = t[u]; }
}

// ---- SiLU gate: out = rb(rb(silu(g)) * u), as eager rounds ---------------------------------------
__device__ __forceinline__ V8 gate8(const V8& g, const V8& u) {
    V8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float x = __bfloat162float(g.v[j]);
        float s = rb(x / (1.f + expf(-x)));
        o.v[j] = __float2bfloat16(s * __bfloat162float(u.v[j]));
    }
    return o;
}

// U vectors a thread, a block's U x T vectors contiguous; grid covers everything once (PERSIST = 0)
// or strides over it with a fixed grid.
template <int U, bool CS, bool PERSIST>
__global__ void gate_k(const bf* __restrict__ g, const bf* __restrict__ u, bf* __restrict__ o, int64_t nvec) {
    const int T = blockDim.x;
    for (int64_t blk = blockIdx.x; blk * U * T < nvec; blk += PERSIST ? gridDim.x : (int64_t)1 << 62) {
        int64_t base = blk * U * T + threadIdx.x;
        V8 a[U], b[U];
#pragma unroll
        for (int k = 0; k < U; ++k) { int64_t i = base + (int64_t)k * T; if (i < nvec) { a[k] = ld<CS>(g + i * 8); b[k] = ld<CS>(u + i * 8); } }
#pragma unroll
        for (int k = 0; k < U; ++k) { int64_t i = base + (int64_t)k * T; if (i < nvec) st<CS>(o + i * 8, gate8(a[k], b[k])); }
        if (!PERSIST) break;
    }
}

// ---- HF rotary, q and k the same size: out = rb(rb(x*cos) + rb(rb(rot(x))*sin)) -------------------
// x: [B, H, S, D]; cos/sin: [B, S, D] (broadcast over heads). D = 128.
constexpr int D = 128, HALF = 64;

// The generator's current code: per 8 columns, x at c, x at the partner's half (c % 64 + 64) and at
// (c % 64), cos and sin at c, and a select on c < 64 for each column.
__global__ void rot_gen(const bf* __restrict__ q, const bf* __restrict__ k, const bf* __restrict__ cs,
                        const bf* __restrict__ sn, bf* __restrict__ oq, bf* __restrict__ ok, int64_t numel, int H, int S) {
    for (int64_t e0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; e0 < numel; e0 += (int64_t)gridDim.x * blockDim.x * 8) {
        const int64_t r = e0 / D, c0 = e0 - r * D;
        const int64_t ro0 = D * r, ro1 = D * (r % S) + (int64_t)S * D * (r / ((int64_t)H * S)), ro2 = D * r + HALF;
        V8 x = ld<false>(q + ro0 + c0), hi = ld<false>(q + ro2 + c0 % HALF), lo = ld<false>(q + ro0 + c0 % HALF);
        V8 xk = ld<false>(k + ro0 + c0), hik = ld<false>(k + ro2 + c0 % HALF), lok = ld<false>(k + ro0 + c0 % HALF);
        V8 c = ld<false>(cs + ro1 + c0), s = ld<false>(sn + ro1 + c0), a, b;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const bool first = c0 + j < HALF;
            float cc = __bfloat162float(c.v[j]), ss = __bfloat162float(s.v[j]);
            float rq = first ? rb(-__bfloat162float(hi.v[j])) : __bfloat162float(lo.v[j]);
            float rk = first ? rb(-__bfloat162float(hik.v[j])) : __bfloat162float(lok.v[j]);
            a.v[j] = __float2bfloat16(rb(__bfloat162float(x.v[j]) * cc) + rb(rq * ss));
            b.v[j] = __float2bfloat16(rb(__bfloat162float(xk.v[j]) * cc) + rb(rk * ss));
        }
        st<false>(oq + ro0 + c0, a);
        st<false>(ok + ro0 + c0, b);
    }
}

// Loads only the select's taken branch (the condition is uniform over 8 aligned columns).
__global__ void rot_branch(const bf* __restrict__ q, const bf* __restrict__ k, const bf* __restrict__ cs,
                           const bf* __restrict__ sn, bf* __restrict__ oq, bf* __restrict__ ok, int64_t numel, int H, int S) {
    for (int64_t e0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; e0 < numel; e0 += (int64_t)gridDim.x * blockDim.x * 8) {
        const int64_t r = e0 / D, c0 = e0 - r * D;
        const int64_t ro0 = D * r, ro1 = D * (r % S) + (int64_t)S * D * (r / ((int64_t)H * S));
        const bool first = c0 < HALF;
        const int64_t po = ro0 + (first ? HALF + c0 : c0 - HALF);
        V8 x = ld<false>(q + ro0 + c0), p = ld<false>(q + po), xk = ld<false>(k + ro0 + c0), pk = ld<false>(k + po);
        V8 c = ld<false>(cs + ro1 + c0), s = ld<false>(sn + ro1 + c0), a, b;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float cc = __bfloat162float(c.v[j]), ss = __bfloat162float(s.v[j]);
            float rq = first ? rb(-__bfloat162float(p.v[j])) : __bfloat162float(p.v[j]);
            float rk = first ? rb(-__bfloat162float(pk.v[j])) : __bfloat162float(pk.v[j]);
            a.v[j] = __float2bfloat16(rb(__bfloat162float(x.v[j]) * cc) + rb(rq * ss));
            b.v[j] = __float2bfloat16(rb(__bfloat162float(xk.v[j]) * cc) + rb(rk * ss));
        }
        st<false>(oq + ro0 + c0, a);
        st<false>(ok + ro0 + c0, b);
    }
}

// A thread owns 8 columns of the first half and their 8 partners: every x read once.
template <bool CS>
__global__ void rot_pair(const bf* __restrict__ q, const bf* __restrict__ k, const bf* __restrict__ cs,
                         const bf* __restrict__ sn, bf* __restrict__ oq, bf* __restrict__ ok, int64_t numel, int H, int S) {
    const int64_t npair = numel / 2;
    for (int64_t e0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; e0 < npair; e0 += (int64_t)gridDim.x * blockDim.x * 8) {
        const int64_t r = e0 / HALF, c0 = e0 - r * HALF;
        const int64_t ro0 = D * r, ro1 = D * (r % S) + (int64_t)S * D * (r / ((int64_t)H * S));
        V8 xl = ld<CS>(q + ro0 + c0), xh = ld<CS>(q + ro0 + HALF + c0), kl = ld<CS>(k + ro0 + c0), kh = ld<CS>(k + ro0 + HALF + c0);
        V8 cl = ld<false>(cs + ro1 + c0), ch = ld<false>(cs + ro1 + HALF + c0), sl = ld<false>(sn + ro1 + c0), sh = ld<false>(sn + ro1 + HALF + c0);
        V8 al, ah, bl, bh;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float xlo = __bfloat162float(xl.v[j]), xhi = __bfloat162float(xh.v[j]);
            float klo = __bfloat162float(kl.v[j]), khi = __bfloat162float(kh.v[j]);
            float c1 = __bfloat162float(cl.v[j]), c2 = __bfloat162float(ch.v[j]);
            float s1 = __bfloat162float(sl.v[j]), s2 = __bfloat162float(sh.v[j]);
            al.v[j] = __float2bfloat16(rb(xlo * c1) + rb(rb(-xhi) * s1));
            ah.v[j] = __float2bfloat16(rb(xhi * c2) + rb(xlo * s2));
            bl.v[j] = __float2bfloat16(rb(klo * c1) + rb(rb(-khi) * s1));
            bh.v[j] = __float2bfloat16(rb(khi * c2) + rb(klo * s2));
        }
        st<CS>(oq + ro0 + c0, al); st<CS>(oq + ro0 + HALF + c0, ah);
        st<CS>(ok + ro0 + c0, bl); st<CS>(ok + ro0 + HALF + c0, bh);
    }
}

// ---- timing -----------------------------------------------------------------------------------
static char* g_flush;
static const size_t FLUSH = 256ull << 20;

static double time_us(const std::function<void()>& f, int reps = 40) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> ts;
    for (int i = 0; i < reps; ++i) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, FLUSH));
        CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms * 1000.f);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    cudaEventDestroy(a); cudaEventDestroy(b);
    return ts[ts.size() / 2];
}

static bf* rnd(size_t n, unsigned seed) {
    std::vector<bf> h(n);
    unsigned s = seed;
    for (size_t i = 0; i < n; ++i) { s = s * 1664525u + 1013904223u; h[i] = __float2bfloat16(((s >> 8) / 16777216.f - 0.5f) * 6.f); }
    bf* d; CK(cudaMalloc(&d, n * 2)); CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
    return d;
}

static bool same(const bf* a, const bf* b, size_t n) {
    std::vector<uint16_t> x(n), y(n);
    CK(cudaMemcpy(x.data(), a, n * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(y.data(), b, n * 2, cudaMemcpyDeviceToHost));
    return memcmp(x.data(), y.data(), n * 2) == 0;
}

struct Row { std::string card, variant; double us, copy_us; bool equal; };

int main(int argc, char** argv) {
    CK(cudaMalloc(&g_flush, FLUSH));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::vector<Row> rows;
    auto copy_of = [&](size_t bytes) {  // reads and writes bytes / 2 each way, as the bench's copy
        size_t half = bytes / 2 / 16 * 16;
        char *s, *d; CK(cudaMalloc(&s, half)); CK(cudaMalloc(&d, half));
        double m = time_us([&] { CK(cudaMemcpyAsync(d, s, half, cudaMemcpyDeviceToDevice)); });
        int64_t n = half / 16;
        double v1 = time_us([&] { copy_k<1><<<(n + 255) / 256, 256>>>((int4*)s, (int4*)d, n); });
        double v4 = time_us([&] { copy_k<4><<<(n + 1023) / 1024, 256>>>((int4*)s, (int4*)d, n); });
        cudaFree(s); cudaFree(d);
        return std::vector<double>{m, v1, v4};
    };
    auto add = [&](const std::string& card, const std::vector<double>& cp, const std::string& v, double us, bool eq) {
        rows.push_back({card, v, us, cp[0], eq});
        printf("%-34s %-44s %8.1f us  %5.1f%% of memcpy  %5.1f%% of vec-copy x4  %s\n", card.c_str(), v.c_str(), us,
               100 * cp[0] / us, 100 * cp[2] / us, eq ? "equal" : "DIFFERS");
    };

    for (int64_t cols : {11008LL, 6144LL}) {
        const int64_t n = 4LL * 1024 * cols, nvec = n / 8;
        const std::string card = "gate 4x1024x" + std::to_string(cols);
        bf *g = rnd(n, 1), *u = rnd(n, 2), *o0, *o1;
        CK(cudaMalloc(&o0, n * 2)); CK(cudaMalloc(&o1, n * 2));
        auto cp = copy_of(n * 2 * 3);
        printf("%-34s copies: memcpy %.1f us, vec copy %.1f us, vec copy x4 %.1f us\n", card.c_str(), cp[0], cp[1], cp[2]);
        auto run = [&](const std::string& name, auto kern, int T, int U, int grid) {
            double us = time_us([&] { kern<<<grid, T>>>(g, u, o1, nvec); });
            add(card, cp, name, us, same(o0, o1, n));
        };
        gate_k<1, false, false><<<(nvec + 255) / 256, 256>>>(g, u, o0, nvec);
        CK(cudaDeviceSynchronize());
        for (int T : {128, 256, 512}) {
            run("T" + std::to_string(T) + " U1 (the family's kernel)", gate_k<1, false, false>, T, 1, (nvec + T - 1) / T);
            run("T" + std::to_string(T) + " U2", gate_k<2, false, false>, T, 2, (nvec + 2 * T - 1) / (2 * T));
            run("T" + std::to_string(T) + " U4", gate_k<4, false, false>, T, 4, (nvec + 4 * T - 1) / (4 * T));
            run("T" + std::to_string(T) + " U1 streaming", gate_k<1, true, false>, T, 1, (nvec + T - 1) / T);
            run("T" + std::to_string(T) + " U4 streaming", gate_k<4, true, false>, T, 4, (nvec + 4 * T - 1) / (4 * T));
            run("T" + std::to_string(T) + " U4 persistent x4 waves", gate_k<4, false, true>, T, 4, sms * (2048 / T) * 4);
        }
        cudaFree(g); cudaFree(u); cudaFree(o0); cudaFree(o1);
    }

    {
        const int B = 4, H = 32, S = 1024;
        const int64_t n = (int64_t)B * H * S * D, nc = (int64_t)B * S * D;
        const std::string card = "rotary q,k 4x32x1024x128";
        bf *q = rnd(n, 3), *k = rnd(n, 4), *c = rnd(nc, 5), *s = rnd(nc, 6), *a0, *b0, *a1, *b1;
        CK(cudaMalloc(&a0, n * 2)); CK(cudaMalloc(&b0, n * 2)); CK(cudaMalloc(&a1, n * 2)); CK(cudaMalloc(&b1, n * 2));
        auto cp = copy_of(n * 2 * 4 + nc * 2 * 2);
        printf("%-34s copies: memcpy %.1f us, vec copy %.1f us, vec copy x4 %.1f us\n", card.c_str(), cp[0], cp[1], cp[2]);
        rot_gen<<<(n / 8 + 255) / 256, 256>>>(q, k, c, s, a0, b0, n, H, S);
        CK(cudaDeviceSynchronize());
        auto chk = [&] { return same(a0, a1, n) && same(b0, b1, n); };
        for (int T : {128, 256, 512}) {
            std::string t = "T" + std::to_string(T) + " ";
            double us = time_us([&] { rot_gen<<<(n / 8 + T - 1) / T, T>>>(q, k, c, s, a1, b1, n, H, S); });
            add(card, cp, t + "generated today (3 loads of x)", us, chk());
            us = time_us([&] { rot_branch<<<(n / 8 + T - 1) / T, T>>>(q, k, c, s, a1, b1, n, H, S); });
            add(card, cp, t + "the taken branch only (2 loads)", us, chk());
            us = time_us([&] { rot_pair<false><<<(n / 16 + T - 1) / T, T>>>(q, k, c, s, a1, b1, n, H, S); });
            add(card, cp, t + "pairs (each x once)", us, chk());
            us = time_us([&] { rot_pair<true><<<(n / 16 + T - 1) / T, T>>>(q, k, c, s, a1, b1, n, H, S); });
            add(card, cp, t + "pairs, streaming", us, chk());
        }
    }

    if (argc > 1) {
        FILE* f = fopen(argv[1], "w");
        fprintf(f, "{\"rows\": [\n");
        for (size_t i = 0; i < rows.size(); ++i)
            fprintf(f, "  {\"card\": \"%s\", \"variant\": \"%s\", \"us\": %.3f, \"memcpy_us\": %.3f, \"equal\": %s}%s\n", rows[i].card.c_str(),
                    rows[i].variant.c_str(), rows[i].us, rows[i].copy_us, rows[i].equal ? "true" : "false", i + 1 < rows.size() ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}
