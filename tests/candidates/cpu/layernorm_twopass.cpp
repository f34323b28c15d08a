// LayerNorm card (aten.native_layer_norm, tests/data/workloads/layernorm.py), honest: the mean, then
// the variance as the mean of (x - mean)^2, both summed in double (sequential float sums fell
// outside the tolerance on 2% of the "offset" sets, by up to 1.5e-05). It must pass the "offset"
// input set that layernorm_naive_var.cpp (one-pass E[x^2] - E[x]^2) fails.
// Inputs in card order: x, weight, bias; outputs: y, mean, rstd; scalars: normalized_shape[0], eps.
#include <cmath>
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (n_in != 3 || n_out != 3 || n_sc < 2 || sc[n_sc - 1].kind != FORGE_SCALAR_FLOAT) return 1;
    const forge_tensor* x = &in[0];
    for (int k = 0; k < 3; ++k)
        if (in[k].dtype != FORGE_FLOAT32 || !forge_is_contiguous(&in[k]) || !forge_is_contiguous(&out[k])) return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    if (forge_numel(&in[1]) != cols || forge_numel(&in[2]) != cols || sc[0].i != cols) return 1;
    const int64_t rows = forge_numel(x) / cols;
    if (forge_numel(&out[1]) != rows || forge_numel(&out[2]) != rows) return 1;
    const float eps = (float)sc[n_sc - 1].f;
    const float* src = (const float*)x->data;
    const float* w = (const float*)in[1].data;
    const float* b = (const float*)in[2].data;
    float* y = (float*)out[0].data;
    float* mean_out = (float*)out[1].data;
    float* rstd_out = (float*)out[2].data;
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += a[c];
        const float mean = (float)(s / cols);
        double s2 = 0.0;
        for (int64_t c = 0; c < cols; ++c) s2 += (double)(a[c] - mean) * (a[c] - mean);
        const float rstd = (float)(1.0 / std::sqrt(s2 / cols + eps));
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (a[c] - mean) * rstd * w[c] + b[c];
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
    return 0;
}
