/* softmax on the cpu backend (forge_tui/templates/families/softmax.py fills the entry in after
   cpu_common.h, exp_le0 and the XROW macro): a row an OpenMP iteration, three vectorised passes. */

//@section exp

/* e^x for x <= 0, without branches so that the compiler vectorises it (given the cpu builder's
   -fno-trapping-math): Cody-Waite reduction to r in [-ln2/2, ln2/2], Cephes' single-precision
   polynomial (within 2 ulp), scaled by 2^n through the exponent bits. 0 below -87.3 (where e^x
   leaves the normal floats; -inf included); NaN stays NaN. */
static inline float exp_le0(float x) {
    const bool live = x >= -87.3f;
    const float xs = live ? x : -87.3f;
    const float n = std::floor(xs * 1.44269504088896341f + 0.5f);
    const float r = (xs - n * 0.693359375f) + n * 2.12194440e-4f;
    float q = 1.9875691500e-4f;
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    const float e = q * r * r + r + 1.f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    const float z = live ? e * scale : 0.f;
    return x != x ? x : z;
}
//@section entry

typedef ${ti} TI;
typedef ${to} TO;
static const int64_t ROWS = ${rows}, COLS = ${cols};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    if (n_in != 1 || n_out != 1 || forge_numel(&in[0]) != ROWS * COLS || ${x_check}
        || !forge_is_contiguous(&out[0])) return 2;
    const TI* x = (const TI*)in[0].data;
    TO* y = (TO*)out[0].data;
#pragma omp parallel for schedule(static, ${chunk}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {
        const TI* a = x + XROW(r);
        TO* o = y + r * COLS;
        float m = -INFINITY;
        bool nan = false;
#pragma omp simd reduction(max:m) reduction(||:nan)
        for (int64_t c = 0; c < COLS; ++c) { const float v = to_f(a[c]); m = std::max(m, v); nan = nan || v != v; }
        if (nan || m == -INFINITY) m = NAN;  /* eager: a NaN anywhere, or a row of -inf, gives a row of NaN */
        double s = 0.0;  /* many small terms after a large one: a float sum would drift */
#pragma omp simd reduction(+:s)
        for (int64_t c = 0; c < COLS; ++c) s += exp_le0(to_f(a[c]) - m);
        ${scale}
#pragma omp simd
        for (int64_t c = 0; c < COLS; ++c) { const float xv = to_f(a[c]); o[c] = from_f<TO>(${write}); }
    }
    return 0;
}
