// anticheat 15: an fp32 card computed at bf16 precision
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
#include <cuda_bf16.h>
__global__ void softmax_bf16(const float* x, float* y, int64_t cols) {
    const float* a = x + blockIdx.x * cols;
    __shared__ float red[2];
    if (threadIdx.x == 0) {
        float m = -INFINITY, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, __bfloat162float(__float2bfloat16(a[c])));
        for (int64_t c = 0; c < cols; ++c) s += __bfloat162float(__float2bfloat16(expf(__bfloat162float(__float2bfloat16(a[c])) - m)));
        red[0] = m; red[1] = s;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = __bfloat162float(__float2bfloat16(expf(__bfloat162float(__float2bfloat16(a[c])) - red[0]) / red[1]));
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    softmax_bf16<<<(unsigned)rows, 256, 0, s>>>(x, y, cols);
    return (int)cudaGetLastError();
}
