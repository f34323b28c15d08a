/* The pooling families' entry points (forge_tui/templates/families/pooling.py fills them in after
   cuda_common.cuh and pooling.cuh): the mean pool's, with its launch a mode, then the max pool's,
   with its constants and the checks each mode makes. */

//@section mean_entry

typedef ${tx} TX; typedef ${to} TO;
static const int64_t ROWS = ${rows};
static const int COLS = ${cols};
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[0]) != ROWS * COLS) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
    ${launch}
    return (int)cudaGetLastError();
}
//@section mean_tile
mean_tile<TX, TO, ${threads}, ${cols}><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS, COLS);
//@section mean_vtile
if (forge_aligned(x, 16)) mean_vtile<TX, TO, ${threads}, ${cols}, true><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS);
    else mean_vtile<TX, TO, ${threads}, ${cols}, false><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS);
//@section mean_warp
mean_warp<TX, TO, ${threads}><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS, COLS);
//@section max_consts
static const int64_t NC = ${nc}; static const int H = ${h}, W = ${w}, OH = ${oh}, OW = ${ow}, KH = ${kh}, KW = ${kw}, SH = ${sh}, SW = ${sw}, PH = ${ph}, PW = ${pw}, DH = ${dh}, DW = ${dw};
//@section tile_consts

constexpr int ROWS = ${rows}, IN_ROWS = ${in_rows}, VEC = ${vec}, TILES = ${tiles};
//@section thread_consts

constexpr int PER = ${per};
//@section out_aligned
    if (!forge_aligned(out[0].data, ${owv} * sizeof(TO))) return 5;
//@section idx_aligned
    if (!forge_aligned(out[1].data, 16)) return 5;
//@section in_aligned
    if (!forge_aligned(in[0].data, 16)) return 5;
//@section strip_aligned
    if (!forge_aligned(in[0].data, ${pair} * sizeof(TX))) return 5;
//@section max_entry

typedef ${tx} TX; typedef ${to} TO;
${consts}
constexpr int THREADS = ${threads}, OWV = ${owv};
static const int64_t TOTAL = ${total};
${windows}${kernel}
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[0]) != NC * H * W) return 2;
${guard}    maxpool<<<${blocks}, ${threads}, 0, (cudaStream_t)stream>>>((const TX*)in[0].data, (TO*)out[0].data${idx_arg});
    return (int)cudaGetLastError();
}
