// Accumulates each row's sum into the workspace without clearing it first, trusting it to start
// at zero (as a fresh cudaMalloc often does). The evaluator's poisoned workspace exposes it.
#include <cmath>
#include "forge_kernel.h"

FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* in, int32_t n_in, const forge_tensor* out,
                                           int32_t n_out, const forge_scalar* sc, int32_t n_sc) {
    return forge_numel(&in[0]) / in[0].shape[in[0].ndim - 1] * (int64_t)sizeof(double);
}

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {
    const forge_tensor* x = &in[0];
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    double* sums = (double*)workspace;
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < cols; ++c) sums[r] += std::exp((double)a[c] - m);
        for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = (float)(std::exp((double)a[c] - m) / sums[r]);
    }
    return 0;
}
