/* softmax's entry point and each mode's launch (forge_tui/templates/families/softmax.py fills
   them in after cuda_common.cuh, the XROW macro and softmax.cuh). */

//@section entry

typedef ${ti} TI;
typedef ${to} TO;
static const int64_t ROWS = ${rows};
static const int COLS = ${cols};

${opening}
    if (n_in != 1 || n_out != 1 || forge_numel(&in[0]) != ROWS * COLS || ${x_check}
        || !forge_is_contiguous(&out[0])) return 2;
    const TI* x = (const TI*)in[0].data;
    TO* y = (TO*)out[0].data;
    cudaStream_t s = (cudaStream_t)stream;
    const bool aligned = forge_aligned(x, ${vec} * sizeof(TI)) && forge_aligned(y, ${vec} * sizeof(TO));

${launch}
    return (int)cudaGetLastError();
}
//@section open
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
//@section open_split
static const int64_t WS_BYTES = (int64_t)sizeof(float2) * ${rows} * ${segs};

${entry}
//@section open_stream
${ws_bytes}
${entry}
//@section regs
    if (aligned) softmax_regs<TI, TO, ${tpr}, ${rpb}, ${vec}, ${nv}, ${log}><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS, COLS);
    else softmax_regs<TI, TO, ${tpr}, ${rpb}, 1, ${nv1}, ${log}><<<${blocks}, ${threads}, 0, s>>>(x, y, ROWS, COLS);
//@section online
    if (aligned) softmax_online<TI, TO, ${tpr}, ${vec}, ${log}><<<ROWS, ${tpr}, 0, s>>>(x, y, COLS);
    else softmax_online<TI, TO, ${tpr}, 1, ${log}><<<ROWS, ${tpr}, 0, s>>>(x, y, COLS);
//@section cluster
    if (aligned) softmax_cluster<TI, TO, ${cl}, ${tpr}, ${vec}, ${nv}, ${log}><<<ROWS * ${cl}, ${tpr}, 0, s>>>(x, y, COLS);
    else softmax_cluster<TI, TO, ${cl}, ${tpr}, 1, ${nv1}, ${log}><<<ROWS * ${cl}, ${tpr}, 0, s>>>(x, y, COLS);
//@section stream
    if (ws_bytes < WS_BYTES) return 4;
    float2* part = (float2*)workspace;
${counters}    const unsigned items = (unsigned)((ROWS + ${ahead}) * ${segs} * 2);
    if (aligned) softmax_stream<TI, TO, ${tpr}, ${vec}, ${segs}, ${piece}, ${ahead}, ${log}><<<${grid}, ${tpr}, 0, s>>>(x, y, part, done, ticket, (int)ROWS, items);
    else softmax_stream<TI, TO, ${tpr}, 1, ${segs}, ${piece}, ${ahead}, ${log}><<<${grid}, ${tpr}, 0, s>>>(x, y, part, done, ticket, (int)ROWS, items);
//@section stash
    /* more than 48 KB of dynamic shared memory is opt-in, per kernel (set on every call: no state) */
    if (aligned) {
        cudaFuncSetAttribute(softmax_stash<TI, TO, ${cl}, ${tpr}, ${vec}, ${log}>, cudaFuncAttributeMaxDynamicSharedMemorySize, ${smem});
        softmax_stash<TI, TO, ${cl}, ${tpr}, ${vec}, ${log}><<<ROWS * ${cl}, ${tpr}, ${smem}, s>>>(x, y, COLS, ${stash});
    } else {
        cudaFuncSetAttribute(softmax_stash<TI, TO, ${cl}, ${tpr}, 1, ${log}>, cudaFuncAttributeMaxDynamicSharedMemorySize, ${smem});
        softmax_stash<TI, TO, ${cl}, ${tpr}, 1, ${log}><<<ROWS * ${cl}, ${tpr}, ${smem}, s>>>(x, y, COLS, ${stash});
    }
//@section ring_kernel
softmax_ring<TI, TO, ${cl}, ${tpr}, ${vec}, ${log}, ${bulk}>
//@section ring_args
x, y, COLS, ${stash}, (int)ROWS
//@section ring
    if (aligned && forge_aligned(x, 16))  /* bulk copies start on 16-byte boundaries */
${launch_vec}    else
${launch_one}
//@section split
    if (ws_bytes < WS_BYTES) return 4;
    float2* ws = (float2*)workspace;
    if (aligned) {
        softmax_split_stats<TI, ${tpr}, ${vec}><<<ROWS * ${segs}, ${tpr}, 0, s>>>(x, ws, COLS, ${segs}, ${seg_len});
        softmax_split_write<TI, TO, ${tpr}, ${vec}, ${log}, ${rev}><<<ROWS * ${segs}, ${tpr}, 0, s>>>(x, y, ws, COLS, ${segs}, ${seg_len});
    } else {
        softmax_split_stats<TI, ${tpr}, 1><<<ROWS * ${segs}, ${tpr}, 0, s>>>(x, ws, COLS, ${segs}, ${seg_len});
        softmax_split_write<TI, TO, ${tpr}, 1, ${log}, ${rev}><<<ROWS * ${segs}, ${tpr}, 0, s>>>(x, y, ws, COLS, ${segs}, ${seg_len});
    }
