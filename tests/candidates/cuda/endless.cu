// hang: a kernel that never finishes
#include <cuda_runtime.h>
#include <math.h>
#include "forge_kernel.h"
// Spins until an output element holds a value nothing ever writes (the evaluator poisons it).
__global__ void spin(float* y, int64_t n) {
    volatile float* flag = y + 1;
    while (*flag != 12345.0f) { }
    y[0] = (float)n;
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    spin<<<1, 1, 0, s>>>(y, rows);
    return 0;
}
