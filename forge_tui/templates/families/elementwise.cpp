/* The elementwise family's C++ (forge_tui/templates/families/elementwise.py): the rounding and
   NaN-propagating helpers its expressions call, and the fused loop with its entry point. */

//@section rounding

#define ROUND_FLOAT32(v) (v)
#define ROUND_FLOAT16(v) round_to<fhalf>(v)
#define ROUND_BFLOAT16(v) round_to<fbf16>(v)
#define RSQRT(v) (1.f / std::sqrt(v))
static inline float MAXIMUM(float a, float b) { return (a != a || b != b) ? NAN : std::max(a, b); }
static inline float MINIMUM(float a, float b) { return (a != a || b != b) ? NAN : std::min(a, b); }
//@section entry

typedef ${to} TO;

static void run(${params}, TO* out, const int64_t NUMEL) {
#pragma omp parallel for schedule(static, ${chunk}) if(NUMEL >= PARALLEL_MIN)
    for (int64_t i = 0; i < NUMEL; ++i) {
            ${same}
            ${loads}
            ${comp}
            out[i] = from_f<TO>(${result});
    }
}

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const int64_t NUMEL = ${n};
    if (n_in != ${n_in} || forge_numel(&out[0]) != NUMEL) return 2;
    run(${args}, (TO*)out[0].data, NUMEL);
    return 0;
}
