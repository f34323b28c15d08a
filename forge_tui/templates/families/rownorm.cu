/* The row norms' entry point (forge_tui/templates/families/rownorm.py fills it in after
   cuda_common.cuh and rownorm.cuh). */

//@section rms_types
typedef ${tx} TX; typedef ${tw} TW; typedef ${to} TO; typedef ${tm} TM;
//@section ln_types
typedef ${tx} TX; typedef ${tw} TW; typedef ${tb} TB; typedef ${to} TO; typedef ${ts} TS;
//@section entry

${types}
static const int COLS = ${cols};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t ROWS = ${rows};
    if (forge_numel(&in[${x}]) != ROWS * COLS || !forge_is_contiguous(&out[0])) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const bool aligned = ${checks};
    if (aligned) ${kernel}<${tparams}, ${tpr}, ${rpb}, ${vec}, ${nv}><<<${blocks}, ${threads}, 0, s>>>(${args}, ROWS, COLS, ${eps});
    else ${kernel}<${tparams}, ${tpr}, ${rpb}, 1, ${nv1}><<<${blocks}, ${threads}, 0, s>>>(${args}, ROWS, COLS, ${eps});
    return (int)cudaGetLastError();
}
