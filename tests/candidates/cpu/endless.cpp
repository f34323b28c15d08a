// hang: never returns
#include <cmath>
#include <cstdlib>
#include <cstring>
#include "forge_kernel.h"


FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    volatile int64_t i = 0;
    while (i >= 0) i = i + 1 - 1;
    return 0;
}
