// Row softmax that keeps each row's max and 1/sum in the caller's workspace (forge_launch_ws):
// pass 1 writes the statistics of every row, pass 2 writes the outputs from them. It also checks
// that the workspace did not keep the marker it leaves behind: the evaluator re-poisons it before
// every call, so a stale marker means state survived between calls (error 9).
#include <cmath>
#include <cstring>
#include "forge_kernel.h"

static const uint64_t MARKER = 0x0123456789abcdefULL;

FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* in, int32_t n_in, const forge_tensor* out,
                                           int32_t n_out, const forge_scalar* sc, int32_t n_sc) {
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32) return -1;
    const int64_t rows = forge_numel(x) / x->shape[x->ndim - 1];
    return (int64_t)sizeof(uint64_t) + rows * 2 * (int64_t)sizeof(float);
}

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {
    const forge_tensor* x = &in[0];
    if (x->dtype != FORGE_FLOAT32 || !forge_is_contiguous(x)) return 1;
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    if (ws_bytes < (int64_t)sizeof(uint64_t) + rows * 2 * (int64_t)sizeof(float)) return 8;
    uint64_t marker;
    std::memcpy(&marker, workspace, sizeof marker);
    if (marker == MARKER) return 9;
    float* stats = (float*)((char*)workspace + sizeof(uint64_t));
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        stats[2 * r] = m;
        stats[2 * r + 1] = (float)(1.0 / s);
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float* y = dst + r * cols;
        for (int64_t c = 0; c < cols; ++c) y[c] = (float)(std::exp((double)a[c] - stats[2 * r]) * stats[2 * r + 1]);
    }
    std::memcpy(workspace, &MARKER, sizeof marker);
    return 0;
}
