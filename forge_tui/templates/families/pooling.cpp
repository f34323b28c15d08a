/* The pooling families on the cpu backend (forge_tui/templates/families/pooling.py fills them in
   after cpu_common.h; the max pool's constants are pooling.cu's max_consts). */

//@section mean_entry

typedef ${tx} TX; typedef ${to} TO;
static const int64_t ROWS = ${rows}, COLS = ${cols};
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[0]) != ROWS * COLS) return 2;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
#pragma omp parallel for schedule(static, ${chunk}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {
        float s = 0.f;
        for (int64_t c = 0; c < COLS; ++c) s += to_f(x[r * COLS + c]);
        y[r] = from_f<TO>(s / (float)COLS);
    }
    return 0;
}
//@section max_entry

typedef ${tx} TX; typedef ${to} TO;
${consts}
using std::min;
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[0]) != NC * H * W) return 2;
    const TX* x = (const TX*)in[0].data;
    TO* y = (TO*)out[0].data;
    ${idx_ptr}
#pragma omp parallel for schedule(static, ${chunk}) if(NC * H * W >= PARALLEL_MIN)
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
        int hs = oh * SH - PH, ws = ow * SW - PW;
        const int he = min(hs + (KH - 1) * DH + 1, H), we = min(ws + (KW - 1) * DW + 1, W);
        while (hs < 0) hs += DH;
        while (ws < 0) ws += DW;
        float best = -INFINITY;
        int64_t bi = (int64_t)hs * W + ws;
        const TX* plane = x + nc * H * W;
        for (int ih = hs; ih < he; ih += DH)
            for (int iw = ws; iw < we; iw += DW) {
                const float v = to_f(plane[ih * W + iw]);
                if (v > best || v != v) { best = v; bi = (int64_t)ih * W + iw; }
            }
        const int64_t o = (nc * OH + oh) * OW + ow;
        y[o] = from_f<TO>(best);
        ${idx_store}
    }
    return 0;
}
