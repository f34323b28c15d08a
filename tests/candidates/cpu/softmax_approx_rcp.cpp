// An honest-looking softmax whose reciprocal of the row sum is an approximation off by a relative
// 3e-4 (an unrefined hardware reciprocal, say): every output element carries a relative error of
// 3e-4, about 30x the fp32 tolerance (1e-5) and 30x under a tolerance 1000x looser (1e-2).
#include <cmath>
#include "forge_kernel.h"

static const double RCP_ERROR = 3e-4;

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x)) return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float* y = dst + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        const double inv = (1.0 / s) * (1.0 + RCP_ERROR);
        for (int64_t c = 0; c < cols; ++c) y[c] = (float)(std::exp((double)a[c] - m) * inv);
    }
    return 0;
}
