/* group_norm's entry points, one section a mode (forge_tui/templates/families/group_norm.py fills
   them in after cuda_common.cuh and group_norm.cuh). */

//@section types
typedef ${tx} TX; typedef ${tw} TW; typedef ${tb} TB; typedef ${to} TO; typedef ${ts} TS;
//@section check
    if (forge_numel(&in[${x}]) != TOTAL || !forge_is_contiguous(&out[0])) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const TX* x = (const TX*)in[${x}].data;
    TO* y = (TO*)out[0].data;
    TS* mean_out = (TS*)out[1].data;
    TS* rstd_out = (TS*)out[2].data;
    const bool aligned = forge_aligned(x, ${vec} * sizeof(TX)) && forge_aligned(y, ${vec} * sizeof(TO));
//@section args
x, ${w}, ${b}, y, mean_out, rstd_out, ${glen}, ${hw}, ${g}, ${cpg}, ${eps}
//@section cluster

${types}
static const int64_t TOTAL = ${total};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
${check}    if (aligned) gn_cluster<TX, TW, TB, TO, TS, ${cl}, ${threads}, ${vec}, ${nv}><<<${blocks}, ${threads}, 0, s>>>(${args});
    else gn_cluster<TX, TW, TB, TO, TS, ${cl}, ${threads}, 1, ${nv1}><<<${blocks}, ${threads}, 0, s>>>(${args});
    return (int)cudaGetLastError();
}
//@section stash

${types}
static const int64_t TOTAL = ${total};
static const int SMEM = ${smem};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
${check}    /* more than 48 KB of dynamic shared memory is opt-in, per kernel (set on every call: no state) */
    if (aligned) {
        cudaFuncSetAttribute(gn_stash<TX, TW, TB, TO, TS, ${cl}, ${threads}, ${vec}>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        gn_stash<TX, TW, TB, TO, TS, ${cl}, ${threads}, ${vec}><<<${blocks}, ${threads}, SMEM, s>>>(${args}, ${stash});
    } else {
        cudaFuncSetAttribute(gn_stash<TX, TW, TB, TO, TS, ${cl}, ${threads}, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        gn_stash<TX, TW, TB, TO, TS, ${cl}, ${threads}, 1><<<${blocks}, ${threads}, SMEM, s>>>(${args}, ${stash});
    }
    return (int)cudaGetLastError();
}
//@section ring_kernel
gn_ring<TX, TW, TB, TO, TS, ${cl}, ${threads}, ${vec}, ${bulk}>
//@section ring

${types}
static const int64_t NG = ${ng}, TOTAL = ${total};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
${check}    if (aligned && forge_aligned(x, 16))  /* bulk copies start on 16-byte boundaries */
${launch_vec}    else
${launch_one}    return (int)cudaGetLastError();
}
//@section stream_args
x, ${w}, ${b}, y, mean_out, rstd_out, part, done, ticket, ${glen}, ${hw}, ${g}, ${cpg}, ${eps}
//@section stream

${types}
static const int64_t NG = ${ng}, TOTAL = ${total};
static const int PIECES = ${pieces}, CHUNK = ${chunk}, AHEAD = ${ahead};
/* per piece: count, mean, M2; then a finished-pieces count per group and the ticket counter */
${ws_bytes}
${entry}
${check}    if (ws_bytes < WS_BYTES) return 4;
    float* part = (float*)workspace;
${counters}    const unsigned items = (unsigned)((NG + AHEAD) * PIECES * 2);
    if (aligned) gn_stream<TX, TW, TB, TO, TS, ${threads}, ${vec}, PIECES, CHUNK, AHEAD><<<${grid}, ${threads}, 0, s>>>(${args}, (int)NG, items);
    else gn_stream<TX, TW, TB, TO, TS, ${threads}, 1, PIECES, CHUNK, AHEAD><<<${grid}, ${threads}, 0, s>>>(${args}, (int)NG, items);
    return (int)cudaGetLastError();
}
//@section split_args
x, ${w}, ${b}, y, ws, mean_out, rstd_out, ${pieces}, ${hw}, ${c}, ${cpg}, ${eps}
//@section split

${types}
static const int64_t NG = ${ng}, GLEN = ${glen}, TOTAL = ${total};
static const int64_t WS_BYTES = (int64_t)sizeof(float) * NG * ${pieces} * 3;  /* per piece: count, mean, M2 */

${entry}
${check}    if (ws_bytes < WS_BYTES) return 4;
    float* ws = (float*)workspace;
    if (aligned) {
        gn_partial<TX, ${threads}, ${vec}><<<NG * ${pieces}, ${threads}, 0, s>>>(x, ws, GLEN, ${chunk}, ${pieces});
        gn_apply<TX, TW, TB, TO, TS, ${threads}, ${vec}, ${unroll}, ${rev}><<<${blocks}, ${threads}, 0, s>>>(${args}, ${per_plane});
    } else {
        gn_partial<TX, ${threads}, 1><<<NG * ${pieces}, ${threads}, 0, s>>>(x, ws, GLEN, ${chunk}, ${pieces});
        gn_apply<TX, TW, TB, TO, TS, ${threads}, 1, ${unroll}, ${rev}><<<${blocks1}, ${threads}, 0, s>>>(${args}, ${per_plane1});
    }
    return (int)cudaGetLastError();
}
