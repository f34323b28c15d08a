// Defines forge_launch_ws without forge_workspace_bytes: the static checks name the missing half.
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {
    float* y = (float*)out[0].data;
    for (int64_t i = 0; i < forge_numel(&out[0]); ++i) y[i] = 0.f;
    return 0;
}
