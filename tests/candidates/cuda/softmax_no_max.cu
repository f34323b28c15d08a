// inputs that never occur in the checks: a softmax without the max subtraction (exp overflows above
// about 88 in fp32: the overflow input set catches it)
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
// One block per row: max, then sum of exp, then normalise (fp32, contiguous rows).
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
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(a[c]);
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
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(a[c]) * inv;
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    if (in[0].dtype != FORGE_FLOAT32 || !forge_is_contiguous(&in[0])) return 1;
    softmax_rows<<<(unsigned)rows, 256, 0, s>>>(x, y, cols);
    return (int)cudaGetLastError();
}
