// anticheat 1: launches a kernel that writes nothing (the freed reference output trick)
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
__global__ void nothing(float* y) { }

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    nothing<<<1, 32, 0, s>>>(y);
    return (int)cudaGetLastError();
}
