// mul of one fp32 tensor by itself (tests/data/workloads/leaf_mul.py): the card's one input squared.
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (n_in != 1 || n_out != 1) return 1;
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x)) return 1;
    const int64_t n = forge_numel(x);
    const float* a = (const float*)x->data;
    float* y = (float*)out[0].data;
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] * a[i];
    return 0;
}
