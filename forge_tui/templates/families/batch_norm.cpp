/* batch_norm on the cpu backend (forge_tui/templates/families/batch_norm.py fills it in after
   cpu_common.h): an (n, c) plane an OpenMP iteration, eager's formula. */

//@section entry

typedef ${tx} TX; typedef ${to} TO; typedef ${tp} TP;
static const int64_t N = ${n}, C = ${c}, HW = ${hw};

static void bn(const TX* x, TO* y, const TP* w, const TP* b, const TP* rm, const TP* rv) {
#pragma omp parallel for schedule(static, ${chunk}) if(N * C * HW >= PARALLEL_MIN)
    for (int64_t nc = 0; nc < N * C; ++nc) {
        const int64_t c = nc % C;
        const float invstd = 1.f / std::sqrt(to_f(rv[c]) + ${eps});
        const float gamma = w ? to_f(w[c]) : 1.f, beta = b ? to_f(b[c]) : 0.f, mean = to_f(rm[c]);
        const TX* a = x + nc * HW;
        TO* o = y + nc * HW;
        for (int64_t k = 0; k < HW; ++k) o[k] = from_f<TO>((to_f(a[k]) - mean) * invstd * gamma + beta);
    }
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (forge_numel(&in[${x}]) != N * C * HW || !forge_is_contiguous(&out[0])) return 2;
    bn((const TX*)in[${x}].data, (TO*)out[0].data, ${params});
    return 0;
}
