/* The row norms on the cpu backend (forge_tui/templates/families/rownorm.py fills the entry in
   after cpu_common.h, with the body of the norm it serves): a row an OpenMP iteration. */

//@section rms_types
typedef ${tx} TX; typedef ${tw} TW; typedef ${to} TO; typedef ${tm} TM;
//@section ln_types
typedef ${tx} TX; typedef ${tw} TW; typedef ${tb} TB; typedef ${to} TO; typedef ${ts} TS;
//@section ln_outs
TS* mean_out = (TS*)out[1].data; TS* rstd_out = (TS*)out[2].data;
//@section rms_body

        double ss = 0.0;
        for (int64_t c = 0; c < COLS; ++c) { float v = to_f(a[c]); ss += v * v; }
        const float rs = 1.f / std::sqrt((float)(ss / (double)COLS) + ${eps});
        for (int64_t c = 0; c < COLS; ++c) o[c] = from_f<TO>(to_f(w[c]) * round_to<TM>(to_f(a[c]) * rs));
//@section ln_body

        double sum = 0.0;
        for (int64_t c = 0; c < COLS; ++c) sum += to_f(a[c]);
        const float mean = (float)(sum / (double)COLS);
        double var = 0.0;
        for (int64_t c = 0; c < COLS; ++c) { double d = to_f(a[c]) - mean; var += d * d; }
        const float rstd = 1.f / std::sqrt((float)(var / (double)COLS) + ${eps});
        for (int64_t c = 0; c < COLS; ++c) {
            float v = (to_f(a[c]) - mean) * rstd;
            if (w) v *= to_f(w[c]);
            if (b) v += to_f(b[c]);
            o[c] = from_f<TO>(v);
        }
        mean_out[r] = from_f<TS>(mean);
        rstd_out[r] = from_f<TS>(rstd);
//@section entry

${types}
static const int64_t COLS = ${cols};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t ROWS = ${rows};
    if (forge_numel(&in[${x}]) != ROWS * COLS || !forge_is_contiguous(&out[0])) return 2;
    ${inputs}
    TO* y = (TO*)out[0].data;
    ${outs}
#pragma omp parallel for schedule(static, ${chunk}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {
        const TX* a = x + r * COLS;
        TO* o = y + r * COLS;${body}
    }
    return 0;
}
