// state across calls in the descriptors it is handed: leaves a marker in an unused dimension of
// its output's descriptor and in a scalar's reserved field (casting their const away) and returns
// 9 if a later call is handed either back. The runner hands every call fresh copies, so none is.
#include <cmath>
#include <cstdint>
#include "forge_kernel.h"
static const int64_t MARK = 0x5EED5EEDLL;
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    forge_tensor* o = &out[0];
    if (o->shape[FORGE_MAX_DIMS - 1] == MARK || o->stride[FORGE_MAX_DIMS - 1] == MARK) return 9;
    if (((forge_tensor*)in)[0].shape[FORGE_MAX_DIMS - 1] == MARK) return 9;
    for (int32_t k = 0; k < n_sc; ++k)
        if (sc[k].reserved == (int32_t)MARK) return 9;
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)o->data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (float)(std::exp((double)a[c] - m) / s);
    }
    o->shape[FORGE_MAX_DIMS - 1] = MARK;
    o->stride[FORGE_MAX_DIMS - 1] = MARK;
    ((forge_tensor*)in)[0].shape[FORGE_MAX_DIMS - 1] = MARK;
    for (int32_t k = 0; k < n_sc; ++k) ((forge_scalar*)sc)[k].reserved = (int32_t)MARK;
    return 0;
}
