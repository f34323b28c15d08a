/* batch_norm's device code (forge_tui/templates/families/batch_norm.py): the flat mode's
   kernel and the plane mode's. */

//@section flat

/* The tensor as one flat array, a grid of a few waves striding over it, UNROLL vectors a thread
   loaded before any is written. An element's channel is (index / HW) % C (compile-time constants:
   multiplications); IN_PLANE (VEC divides HW): a vector is in one channel, found once. Eager's
   formula: (x - mean) * invstd * w + b. */
template <typename TP>
__device__ __forceinline__ void bn_coef(const TP* __restrict__ w, const TP* __restrict__ b,
                                        const TP* __restrict__ rm, const TP* __restrict__ rv, int64_t c,
                                        float eps, float& mean, float& invstd, float& gamma, float& beta) {
    mean = to_f(__ldg(rm + c));
    invstd = rsqrtf(to_f(__ldg(rv + c)) + eps);
    gamma = w ? to_f(__ldg(w + c)) : 1.f;
    beta = b ? to_f(__ldg(b + c)) : 0.f;
}

template <typename TX, typename TO, typename TP, int THREADS, int VEC, int UNROLL, int64_t CH, int64_t PLANE,
          bool IN_PLANE>
__global__ void __launch_bounds__(THREADS) bn_flat(const TX* __restrict__ x, TO* __restrict__ y,
                                                   const TP* __restrict__ w, const TP* __restrict__ b,
                                                   const TP* __restrict__ rm, const TP* __restrict__ rv,
                                                   int64_t total, float eps) {
    const int64_t step = (int64_t)gridDim.x * THREADS * VEC * UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * THREADS * VEC * UNROLL; base < total; base += step) {
        float v[UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
            if (k < total) load_vec<TX, VEC>(x + k, v[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
            if (k >= total) continue;
            float mean, invstd, gamma, beta;
            if (IN_PLANE) bn_coef(w, b, rm, rv, (k / PLANE) % CH, eps, mean, invstd, gamma, beta);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                if (!IN_PLANE) bn_coef(w, b, rm, rv, ((k + j) / PLANE) % CH, eps, mean, invstd, gamma, beta);
                v[u][j] = (v[u][j] - mean) * invstd * gamma + beta;
            }
            store_vec<TO, VEC>(y + k, v[u]);
        }
    }
}
//@section plane

/* grid.x = one (n, c) plane, grid.y = pieces of it; eager's formula: (x - mean) * invstd * w + b. */
template <typename TX, typename TO, typename TP, int THREADS, int VEC, int UNROLL>
__global__ void __launch_bounds__(THREADS) bn_apply(const TX* __restrict__ x, TO* __restrict__ y,
                                                    const TP* __restrict__ w, const TP* __restrict__ b,
                                                    const TP* __restrict__ rm, const TP* __restrict__ rv,
                                                    int64_t channels, int64_t hw, float eps) {
    const int64_t plane = blockIdx.x;
    const int64_t c = plane % channels;
    const float invstd = rsqrtf(to_f(rv[c]) + eps);
    const float gamma = w ? to_f(w[c]) : 1.f, beta = b ? to_f(b[c]) : 0.f, mean = to_f(rm[c]);
    const TX* a = x + plane * hw;
    TO* o = y + plane * hw;
    const int64_t base = (int64_t)blockIdx.y * THREADS * VEC * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t k = base + ((int64_t)u * THREADS + threadIdx.x) * VEC;
        if (k < hw) {
            float v[VEC];
            load_vec<TX, VEC>(a + k, v);
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = (v[j] - mean) * invstd * gamma + beta;
            store_vec<TO, VEC>(o + k, v);
        }
    }
}
