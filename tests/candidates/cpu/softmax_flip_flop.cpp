// Nondeterministic: a softmax whose result alternates from one call to the next between
// y + d and y - d, with d = 0.8 x the fp32 tolerance (1e-5 x (|y| + rms of the output)). Each
// run alone is within tolerance of the reference; two runs on the same inputs are 1.6 x the
// tolerance apart, so only the comparison of the two runs with each other can reject it. (The
// call counter is state kept between calls, which the static checks reject: the runtime check
// is tested with them off.)
#include <cmath>
#include "forge_kernel.h"

static int calls = 0;

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x)) return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    const int64_t n = rows * cols;
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
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
    // the scale the judge measures tolerances against: the RMS of the finite outputs
    double sq = 0.0;
    int64_t finite = 0;
    for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(dst[i])) { sq += (double)dst[i] * dst[i]; ++finite; }
    const double rms = finite ? std::sqrt(sq / finite) : 1.0;
    const double sign = (calls++ % 2 == 0) ? 1.0 : -1.0;
    const double d = 0.8e-5;
    for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(dst[i])) dst[i] = (float)(dst[i] + sign * d * (std::fabs((double)dst[i]) + rms));
    return 0;
}
