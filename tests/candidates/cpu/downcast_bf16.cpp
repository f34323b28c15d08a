// anticheat 15: computes an fp32 card in bf16 precision
#include <cmath>
#include <cstdlib>
#include <cstring>
#include "forge_kernel.h"
static float to_bf16(float v) { unsigned u; memcpy(&u, &v, 4); u = (u + 0x8000u) & 0xffff0000u; memcpy(&v, &u, 4); return v; }

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, to_bf16(x[r * cols + c]));
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) s = to_bf16(s + to_bf16(expf(to_bf16(x[r * cols + c]) - m)));
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = to_bf16(to_bf16(expf(to_bf16(x[r * cols + c]) - m)) / s);
    }
    return 0;
}
