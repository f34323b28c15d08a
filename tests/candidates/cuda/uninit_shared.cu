// anticheat 2: reads shared memory that was never written
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
__global__ void stale(const float* x, float* y, int64_t cols) {
    __shared__ float buf[1024];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = buf[c & 1023];
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    stale<<<(unsigned)rows, 256, 0, s>>>(x, y, cols);
    return (int)cudaGetLastError();
}
