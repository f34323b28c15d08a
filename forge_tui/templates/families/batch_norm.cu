/* batch_norm's entry points (forge_tui/templates/families/batch_norm.py fills them in after
   cuda_common.cuh and batch_norm.cuh): the entry, then each mode's launch at VEC and at 1. */

//@section entry

typedef ${tx} TX; typedef ${to} TO; typedef ${tp} TP;
static const int64_t N = ${n}, C = ${c}, HW = ${hw};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[${x}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const TX* x = (const TX*)in[${x}].data;
    TO* y = (TO*)out[0].data;
${setup}    if (forge_aligned(x, ${vec} * sizeof(TX)) && forge_aligned(y, ${vec} * sizeof(TO)))
        ${launch}
    else
        ${scalar_launch}
    return (int)cudaGetLastError();
}
//@section params
${w}, ${b}, (const ${tp}*)in[${rm}].data, (const ${tp}*)in[${rv}].data
//@section flat_launch
bn_flat<TX, TO, TP, ${threads}, ${vec}, ${unroll}, C, HW, ${in_plane}><<<${grid}, ${threads}, 0, s>>>(x, y, ${params}, N * C * HW, ${eps});
//@section plane_setup
    dim3 grid((unsigned)(N * C), ${blocks_per_plane});
//@section plane_launch
bn_apply<TX, TO, TP, ${threads}, ${vec}, ${unroll}><<<grid, ${threads}, 0, s>>>(x, y, ${params}, C, HW, ${eps});
