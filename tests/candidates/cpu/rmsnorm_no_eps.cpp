// RMSNorm module card WITHOUT the epsilon: y = weight * x / sqrt(mean(x^2)). Within fp32 tolerance on
// ordinary inputs (eps 1e-6 is far below the mean square), wrong on all-zero rows (0/0 = NaN) and on tiny
// magnitudes (x*x far below eps): the "zeros" and "tiny" input sets must reject it. Inputs in card
// order: x (rows x cols), weight (cols); scalars 0.exponent=2, 1.dim[0]=-1, 1.keepdim=True, 2.other=eps
// (checked for the card's layout, then ignored).
#include <cmath>
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (n_in != 2 || n_out != 1 || n_sc < 4 || sc[3].kind != FORGE_SCALAR_FLOAT) return 1;
    const forge_tensor* x = &in[0];
    const forge_tensor* w = &in[1];
    if (x->dtype != FORGE_FLOAT32 || w->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x) ||
        !forge_is_contiguous(w) || !forge_is_contiguous(&out[0]))
        return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    if (forge_numel(w) != cols) return 1;
    const int64_t rows = forge_numel(x) / cols;
    const float* src = (const float*)x->data;
    const float* wt = (const float*)w->data;
    float* dst = (float*)out[0].data;
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float* y = dst + r * cols;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += (double)a[c] * a[c];
        const float var = (float)(s / cols);
        const float inv = 1.0f / std::sqrt(var);  // eps omitted
        for (int64_t c = 0; c < cols; ++c) y[c] = wt[c] * (a[c] * inv);
    }
    return 0;
}
