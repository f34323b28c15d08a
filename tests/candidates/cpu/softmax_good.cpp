// Row softmax over the last dim of a contiguous fp32 tensor: one pass for max, one for sum, one to write.
#include <cmath>
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x)) return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float* y = dst + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        const double inv = 1.0 / s;
        for (int64_t c = 0; c < cols; ++c) y[c] = (float)(std::exp((double)a[c] - m) * inv);
    }
    return 0;
}
