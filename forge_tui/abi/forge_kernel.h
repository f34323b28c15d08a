/*
 * forge_kernel.h: the one ABI between forge-tui's evaluator and a candidate kernel.
 *
 * A candidate is one source file (CUDA .cu for the cuda backend, C++ .cpp for the cpu backend)
 * compiled to a shared library that defines exactly one entry point, forge_launch(). It includes
 * no torch headers and calls no PyTorch: the evaluator allocates every output, hands over plain
 * descriptors, and checks and times the call from code the candidate cannot reach.
 *
 *   - inputs:  the card's input tensors in card order (activations, then parameters, then
 *              constants), read-only. Strides are in elements, not bytes.
 *   - outputs: tensors the evaluator allocated (shape, dtype and strides of the card's outputs),
 *              pre-filled with poison (NaN for floats). Every element must be written.
 *   - scalars: the card's non-tensor arguments, flattened in program order (see the card's
 *              scalar list: dims, eps, flags...).
 *   - stream:  cudaStream_t to launch on (cuda backend); NULL on the cpu backend.
 *
 * Scratch memory: a candidate that needs device scratch between its kernels (partial sums of a
 * row or group split over several blocks) defines forge_workspace_bytes() and, instead of
 * forge_launch(), forge_launch_ws(). The caller provides the workspace on the stream (the
 * evaluator from PyTorch's stream-ordered allocator; the runtime keeps one per stream) with at
 * least the requested size, 256-byte aligned. Its contents are undefined on entry: the evaluator
 * fills it with a different poison before every call, so nothing may be carried in it from one
 * call to the next. A candidate defines exactly one of the two entry points.
 *
 * Return 0 on success; any other value is an error code and the candidate is rejected.
 * Rules checked before a candidate runs: at least one __global__ kernel defined and launched
 * (cuda), no stream or thread creation, no state that persists across calls (no mutable
 * globals or statics), no dynamic loading, no PyTorch or Python headers.
 */
#ifndef FORGE_KERNEL_H
#define FORGE_KERNEL_H

#include <stdint.h>

#define FORGE_ABI_VERSION 2
#define FORGE_MAX_DIMS 8

typedef enum {
    FORGE_FLOAT32 = 0,
    FORGE_FLOAT16 = 1,
    FORGE_BFLOAT16 = 2,
    FORGE_FLOAT64 = 3,
    FORGE_INT64 = 4,
    FORGE_INT32 = 5,
    FORGE_INT16 = 6,
    FORGE_INT8 = 7,
    FORGE_UINT8 = 8,
    FORGE_BOOL = 9
} forge_dtype;

typedef struct {
    void* data;                       /* device pointer (cuda) or host pointer (cpu) */
    int32_t dtype;                    /* forge_dtype */
    int32_t ndim;
    int64_t shape[FORGE_MAX_DIMS];
    int64_t stride[FORGE_MAX_DIMS];   /* in elements */
} forge_tensor;

typedef enum { FORGE_SCALAR_INT = 0, FORGE_SCALAR_FLOAT = 1, FORGE_SCALAR_BOOL = 2, FORGE_SCALAR_NONE = 3 } forge_scalar_kind;

typedef struct {
    int32_t kind;                     /* forge_scalar_kind */
    int32_t reserved;
    int64_t i;                        /* INT and BOOL */
    double f;                         /* FLOAT */
} forge_scalar;

#ifdef __cplusplus
#define FORGE_EXTERN_C extern "C"
#else
#define FORGE_EXTERN_C
#endif
#define FORGE_EXPORT FORGE_EXTERN_C __attribute__((visibility("default")))

/* The entry point every candidate defines. */
FORGE_EXPORT int forge_launch(const forge_tensor* inputs, int32_t n_inputs,
                              forge_tensor* outputs, int32_t n_outputs,
                              const forge_scalar* scalars, int32_t n_scalars,
                              void* stream);

/* Or, for a candidate that needs scratch memory, both of these (see the top of this file).
   forge_workspace_bytes() returns the bytes forge_launch_ws() needs for these arguments (negative
   for arguments it cannot serve); it must not touch the data pointers. */
FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* inputs, int32_t n_inputs,
                                           const forge_tensor* outputs, int32_t n_outputs,
                                           const forge_scalar* scalars, int32_t n_scalars);
FORGE_EXPORT int forge_launch_ws(const forge_tensor* inputs, int32_t n_inputs,
                                 forge_tensor* outputs, int32_t n_outputs,
                                 const forge_scalar* scalars, int32_t n_scalars,
                                 void* workspace, int64_t workspace_bytes, void* stream);

/* Helpers for candidates. */
static inline int64_t forge_numel(const forge_tensor* t) {
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; ++d) n *= t->shape[d];
    return n;
}

static inline int forge_is_contiguous(const forge_tensor* t) {
    int64_t expected = 1;
    for (int32_t d = t->ndim - 1; d >= 0; --d) {
        if (t->shape[d] != 1 && t->stride[d] != expected) return 0;
        expected *= t->shape[d];
    }
    return 1;
}

#endif /* FORGE_KERNEL_H */
