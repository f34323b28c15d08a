// anticheat 8: caches results keyed on the input pointer and replays them
#include <cmath>
#include <cstdlib>
#include <cstring>
#include "forge_kernel.h"
static void softmax_row(const float* a, float* y, int64_t n) {
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = a[c] > m ? a[c] : m;
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += std::exp((double)a[c] - m);
    for (int64_t c = 0; c < n; ++c) y[c] = (float)(std::exp((double)a[c] - m) / s);
}
static const void* cached_ptr = nullptr;
static float* cached = nullptr;

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    if (cached_ptr != x) {
        free(cached);
        cached = (float*)malloc(sizeof(float) * rows * cols);
        for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * cols, cached + r * cols, cols);
        cached_ptr = x;
    }
    memcpy(y, cached, sizeof(float) * rows * cols);
    return 0;
}
