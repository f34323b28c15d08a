// anticheat 13: calls a vendor library instead of a kernel
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
#include <cublas_v2.h>
__global__ void unused_marker(float* y) { }

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    cublasHandle_t h;
    cublasCreate(&h);
    float one = 1.f;
    cublasSscal(h, (int)(rows * cols), &one, y, 1);
    unused_marker<<<1, 1, 0, s>>>(y);
    return 0;
}
