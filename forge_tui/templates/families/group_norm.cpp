/* group_norm on the cpu backend (forge_tui/templates/families/group_norm.py fills it in after
   cpu_common.h): a group an OpenMP iteration, exact two-pass mean and variance in double. */

//@section entry

typedef ${tx} TX; typedef ${tw} TW; typedef ${tb} TB; typedef ${to} TO; typedef ${ts} TS;
static const int64_t N = ${n}, C = ${c}, HW = ${hw}, G = ${g}, CPG = ${cpg};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[${x}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    const TX* x = (const TX*)in[${x}].data;
    ${w_ptr}
    ${b_ptr}
    TO* y = (TO*)out[0].data;
    TS* mean_out = (TS*)out[1].data;
    TS* rstd_out = (TS*)out[2].data;
#pragma omp parallel for schedule(static, ${chunk}) if(N * C * HW >= PARALLEL_MIN)
    for (int64_t ng = 0; ng < N * G; ++ng) {
        const TX* a = x + ng * CPG * HW;
        TO* o = y + ng * CPG * HW;
        double sum = 0.0;
        for (int64_t k = 0; k < CPG * HW; ++k) sum += to_f(a[k]);
        const float mean = (float)(sum / (double)(CPG * HW));
        double var = 0.0;
        for (int64_t k = 0; k < CPG * HW; ++k) { const double d = to_f(a[k]) - mean; var += d * d; }
        const float rstd = 1.f / std::sqrt((float)(var / (double)(CPG * HW)) + ${eps});
        for (int64_t cc = 0; cc < CPG; ++cc) {
            const int64_t ch = (ng % G) * CPG + cc;
            const float scale = rstd * ${w_expr}, shift = ${b_expr} - mean * scale;
            for (int64_t k = 0; k < HW; ++k) o[cc * HW + k] = from_f<TO>(to_f(a[cc * HW + k]) * scale + shift);
        }
        mean_out[ng] = from_f<TS>(mean);
        rstd_out[ng] = from_f<TS>(rstd);
    }
    return 0;
}
