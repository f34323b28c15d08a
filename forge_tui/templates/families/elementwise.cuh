/* The elementwise family's CUDA code (forge_tui/templates/families/elementwise.py): the rounding
   and NaN-propagating helpers its expressions call, the qualifier of the approximate functions
   (kernels/fast_math.cuh) it takes for math=fast, and the fused kernel with its entry point. */

//@section rounding

#define ROUND_FLOAT32(v) (v)
#define ROUND_FLOAT16(v) round_to<__half>(v)
#define ROUND_BFLOAT16(v) round_to<__nv_bfloat16>(v)
#define RSQRT(v) rsqrtf(v)
__device__ __forceinline__ float MAXIMUM(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }
__device__ __forceinline__ float MINIMUM(float a, float b) { return (a != a || b != b) ? NAN : fminf(a, b); }
//@section fg
#define FG __device__ __forceinline__
//@section entry

typedef ${to} TO;

template <int VEC>
__global__ void __launch_bounds__(${threads}) fused(${params}, TO* __restrict__ out, const int64_t NUMEL) {
    for (int64_t base = ((int64_t)blockIdx.x * ${threads} + threadIdx.x) * VEC; base < NUMEL;
         base += (int64_t)gridDim.x * ${threads} * VEC) {
        ${same_loads}
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const int64_t i = base + j;
            (void)i;
            ${same_pick}
            ${loads}
            ${comp}
            o[j] = ${result};
        }
        store_vec<TO, VEC>(out + base, o);
    }
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t NUMEL = ${n};
    if (n_in != ${n_in} || forge_numel(&out[0]) != NUMEL) return 2;
    if (NUMEL == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (${aligned}) fused<${vec}><<<${grid}, ${threads}, 0, s>>>(${args}, (TO*)out[0].data, NUMEL);
    else fused<1><<<${grid1}, ${threads}, 0, s>>>(${args}, (TO*)out[0].data, NUMEL);
    return (int)cudaGetLastError();
}
