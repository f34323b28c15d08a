// The fold's one-pass epilogue (epilogue.py): y = relu(y + bias[channel] (+ z)), in place.
//
// Built once per machine and GPU arch by the runtime (nvcc, cached like a candidate's build) and
// called through ctypes: a launch costs the host a few microseconds, where a Triton launch from
// Python costs 20-30 and the PyTorch ops it replaces one aten call each. y and z are contiguous,
// channels on dim 1, `inner` elements per (sample, channel) plane; values are added in float32
// and rounded once. NaN propagates through the ReLU as torch.relu's does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

// One thread a pack of VEC elements; VEC divides `inner`, so a pack never spans two channels.
template <typename T, int VEC, typename I, bool HAS_Z>
__global__ void __launch_bounds__(256) bias_residual_relu(T* __restrict__ y, const T* __restrict__ bias,
                                                          const T* __restrict__ z, I packs, I inner_packs,
                                                          I channels) {
    I i = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= packs) return;
    const float b = to_f<T>(bias[(i / inner_packs) % channels]);
    Pack<T, VEC> a = reinterpret_cast<const Pack<T, VEC>*>(y)[i];
    Pack<T, VEC> r;
    if (HAS_Z) r = reinterpret_cast<const Pack<T, VEC>*>(z)[i];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        float v = to_f<T>(a.v[k]) + b;
        if (HAS_Z) v += to_f<T>(r.v[k]);
        a.v[k] = from_f<T>(v < 0.f ? 0.f : v);
    }
    reinterpret_cast<Pack<T, VEC>*>(y)[i] = a;
}

template <typename T, int VEC, typename I>
cudaError_t launch_t(T* y, const T* b, const T* z, int64_t n, int64_t inner, int64_t channels, cudaStream_t s) {
    const int64_t packs = n / VEC;
    const int threads = 256;
    const int64_t blocks = (packs + threads - 1) / threads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    if (blocks == 0) return cudaSuccess;
    if (z)
        bias_residual_relu<T, VEC, I, true><<<(unsigned)blocks, threads, 0, s>>>(y, b, z, (I)packs, (I)(inner / VEC), (I)channels);
    else
        bias_residual_relu<T, VEC, I, false><<<(unsigned)blocks, threads, 0, s>>>(y, b, z, (I)packs, (I)(inner / VEC), (I)channels);
    return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launch_i(T* y, const T* b, const T* z, int64_t n, int64_t inner, int64_t channels, cudaStream_t s) {
    if (n / VEC < 0x7fffffffLL) return launch_t<T, VEC, uint32_t>(y, b, z, n, inner, channels, s);
    return launch_t<T, VEC, uint64_t>(y, b, z, n, inner, channels, s);
}

bool aligned(const void* p, int bytes) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <typename T>
cudaError_t launch(void* yv, const void* bv, const void* zv, int64_t n, int64_t inner, int64_t channels, cudaStream_t s) {
    T* y = static_cast<T*>(yv);
    const T* b = static_cast<const T*>(bv);
    const T* z = static_cast<const T*>(zv);
    // the widest pack (16 bytes at most) that divides a plane and that both pointers allow
    const int widest = 16 / (int)sizeof(T);
    for (int vec = widest; vec > 1; vec /= 2) {
        if (inner % vec != 0 || !aligned(y, vec * (int)sizeof(T)) || !aligned(z, vec * (int)sizeof(T))) continue;
        if (vec == 8) return launch_i<T, 8>(y, b, z, n, inner, channels, s);
        if (vec == 4) return launch_i<T, 4>(y, b, z, n, inner, channels, s);
        if (vec == 2) return launch_i<T, 2>(y, b, z, n, inner, channels, s);
    }
    return launch_i<T, 1>(y, b, z, n, inner, channels, s);
}

}  // namespace

// dtype: the ABI's codes (kernel_abi.DTYPE_CODES): 0 float32, 1 float16, 2 bfloat16. Returns 0, or the CUDA error's code (the launch's; the
// kernel runs asynchronously on `stream`).
extern "C" int forge_epilogue(void* y, const void* bias, const void* z, int64_t n, int64_t inner, int64_t channels,
                              int dtype, void* stream) {
    if (n < 0 || inner <= 0 || channels <= 0 || n % (inner * channels) != 0) return (int)cudaErrorInvalidValue;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    switch (dtype) {
        case 0: e = launch<float>(y, bias, z, n, inner, channels, s); break;
        case 1: e = launch<__half>(y, bias, z, n, inner, channels, s); break;
        case 2: e = launch<__nv_bfloat16>(y, bias, z, n, inner, channels, s); break;
        default: return (int)cudaErrorInvalidValue;
    }
    return (int)e;
}
