// state across calls in a device global (a variable template: the static checks refuse it; run
// with them off, the judge's fresh inputs catch it): computes on the first call, sets a flag in
// device memory, and from then on the kernel returns at once (expecting the same inputs).
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    const float* a = x + blockIdx.x * cols;
    float* out = y + blockIdx.x * cols;
    __shared__ float red[32];
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, a[c]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
        if (threadIdx.x == 0) red[0] = m;
    }
    __syncthreads();
    m = red[0];
    __syncthreads();
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(a[c] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (threadIdx.x == 0) red[0] = s;
    }
    __syncthreads();
    const float inv = 1.f / red[0];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(a[c] - m) * inv;
}

template <int N> __device__ int forge_seen = 0;

__global__ void once(const float* __restrict__ x, float* __restrict__ y, int64_t cols, int64_t rows) {
    if (forge_seen<0>) return;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* a = x + r * cols;
        float* out = y + r * cols;
        if (threadIdx.x == 0) {
            float m = -INFINITY, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, a[c]);
            for (int64_t c = 0; c < cols; ++c) s += expf(a[c] - m);
            for (int64_t c = 0; c < cols; ++c) out[c] = expf(a[c] - m) / s;
        }
    }
}
__global__ void mark() { forge_seen<0> = 1; }

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    once<<<(unsigned)(rows < 1024 ? rows : 1024), 32, 0, (cudaStream_t)stream>>>((const float*)in[0].data,
                                                                                (float*)out[0].data, cols, rows);
    mark<<<1, 1, 0, (cudaStream_t)stream>>>();
    return 0;
}
