// Declares it cannot serve the arguments (negative workspace size): rejected, never launched.
#include "forge_kernel.h"

FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* in, int32_t n_in, const forge_tensor* out,
                                           int32_t n_out, const forge_scalar* sc, int32_t n_sc) {
    return -1;
}

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {
    return 0;
}
