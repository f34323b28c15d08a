/* The row norms' device code (forge_tui/templates/families/rownorm.py): Hugging Face's RMSNorm
   and LayerNorm, a row held in the registers of TPR threads. */

//@section kernels

template <typename T, int VEC>
__device__ __forceinline__ void load_or(const T* p, bool ok, float (&v)[VEC], float fill) {
    if (ok) load_vec<T, VEC>(p, v);
    else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = fill;
    }
}

/* Hugging Face RMSNorm: y = w * cast<TM>(x * rsqrt(mean(x^2) + eps)), fp32 math. */
template <typename TX, typename TW, typename TM, typename TO, int TPR, int RPB, int VEC, int NV>
__global__ void __launch_bounds__(TPR * RPB) rms_norm_regs(const TX* __restrict__ x, const TW* __restrict__ w,
                                                           TO* __restrict__ y, int64_t rows, int cols, float eps) {
    __shared__ float scratch[RPB * (TPR / 32)];
    const int64_t row = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    const bool live = row < rows;
    const TX* xr = x + (live ? row : 0) * (int64_t)cols;
    float v[NV][VEC];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        load_or<TX, VEC>(xr + c, live && c < cols, v[k], 0.f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) ss += v[k][j] * v[k][j];
    }
    ss = row_reduce<TPR, false>(ss, scratch);
    const float rs = rsqrtf(ss / (float)cols + eps);
    TO* yr = y + (live ? row : 0) * (int64_t)cols;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
            float wv[VEC], o[VEC];
            load_vec<TW, VEC>(w + c, wv);
#pragma unroll
            for (int j = 0; j < VEC; ++j) o[j] = wv[j] * round_to<TM>(v[k][j] * rs);
            store_vec<TO, VEC>(yr + c, o);
        }
    }
}

/* LayerNorm: exact two-step mean and variance from registers; writes y, mean, rstd. */
template <typename TX, typename TW, typename TB, typename TS, typename TO, int TPR, int RPB, int VEC, int NV>
__global__ void __launch_bounds__(TPR * RPB) layer_norm_regs(const TX* __restrict__ x, const TW* __restrict__ w,
                                                             const TB* __restrict__ b, TO* __restrict__ y,
                                                             TS* __restrict__ mean_out, TS* __restrict__ rstd_out,
                                                             int64_t rows, int cols, float eps) {
    __shared__ float scratch[RPB * (TPR / 32)];
    const int64_t row = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    const bool live = row < rows;
    const TX* xr = x + (live ? row : 0) * (int64_t)cols;
    float v[NV][VEC];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        load_or<TX, VEC>(xr + c, live && c < cols, v[k], 0.f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum += v[k][j];
    }
    const float mean = row_reduce<TPR, false>(sum, scratch) / (float)cols;
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) { const float d = v[k][j] - mean; var += d * d; }
        }
    }
    var = row_reduce<TPR, false>(var, scratch) / (float)cols;
    const float rstd = rsqrtf(var + eps);
    TO* yr = y + (live ? row : 0) * (int64_t)cols;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = (k * TPR + t) * VEC;
        if (live && c < cols) {
            float wv[VEC], bv[VEC], o[VEC];
            if (w) load_vec<TW, VEC>(w + c, wv); else { for (int j = 0; j < VEC; ++j) wv[j] = 1.f; }
            if (b) load_vec<TB, VEC>(b + c, bv); else { for (int j = 0; j < VEC; ++j) bv[j] = 0.f; }
#pragma unroll
            for (int j = 0; j < VEC; ++j) o[j] = (v[k][j] - mean) * rstd * wv[j] + bv[j];
            store_vec<TO, VEC>(yr + c, o);
        }
    }
    if (live && t == 0) { mean_out[row] = from_f<TS>(mean); rstd_out[row] = from_f<TS>(rstd); }
}
