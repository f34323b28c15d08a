/* The pooling families' device code (forge_tui/templates/families/pooling.py): the mean pool's
   kernels, then the max pool's windows (OWV neighbouring outputs of one output row, read from
   global memory or a shared-memory tile: they share columns, loaded once each; NaN wins and ties
   keep the first index, as PyTorch does) and its kernels, one a mode. The max pool's kernels take
   ${idx_param} (the indices output, where the card has it) and store ${idx} (idx or nullptr). */

//@section mean

/* THREADS rows per block: the block's rows are one contiguous span, loaded coalesced into shared
   memory, then each thread sums its own row. For short rows (7x7 = 49 in ResNet's pooling). */
template <typename TX, typename TO, int THREADS, int COLS>
__global__ void __launch_bounds__(THREADS) mean_tile(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows, int cols) {
    __shared__ float tile[THREADS * COLS];
    const int64_t r0 = (int64_t)blockIdx.x * THREADS;
    const int64_t nrows = min((int64_t)THREADS, rows - r0);
    const int64_t span = nrows * cols;
    const TX* base = x + r0 * cols;
    for (int64_t k = threadIdx.x; k < span; k += THREADS) tile[k] = to_f(base[k]);
    __syncthreads();
    if (threadIdx.x < nrows) {
        float s = 0.f;
        for (int c = 0; c < cols; ++c) s += tile[threadIdx.x * cols + c];
        y[r0 + threadIdx.x] = from_f<TO>(s / (float)cols);
    }
}

/* As mean_tile, with the block's span (THREADS * COLS elements, a multiple of 16 bytes, from a
   16-byte aligned input) loaded in 16-byte vectors, every load of a thread issued before the first
   is stored: at a few MB the time is the latency of the loads, so all of them are in flight at
   once. The tile keeps the input type. A last block with fewer rows, or an input off 16-byte
   boundaries (VECLOAD false), loads element by element. */
template <typename TX, typename TO, int THREADS, int COLS, bool VECLOAD>
__global__ void __launch_bounds__(THREADS) mean_vtile(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows) {
    constexpr int SPAN = THREADS * COLS;
    constexpr int NV = (int)(SPAN * sizeof(TX) / 16);
    constexpr int LOADS = (NV + THREADS - 1) / THREADS;
    __shared__ __align__(16) TX tile[SPAN];
    const int64_t r0 = (int64_t)blockIdx.x * THREADS;
    const int nrows = (int)min((int64_t)THREADS, rows - r0);
    const TX* base = x + r0 * COLS;
    if (VECLOAD && nrows == THREADS) {
        const uint4* src = reinterpret_cast<const uint4*>(base);
        uint4 v[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = (int)threadIdx.x + k * THREADS;
            if (i < NV) v[k] = __ldg(src + i);
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = (int)threadIdx.x + k * THREADS;
            if (i < NV) reinterpret_cast<uint4*>(tile)[i] = v[k];
        }
    } else {
        for (int k = threadIdx.x; k < nrows * COLS; k += THREADS) tile[k] = base[k];
    }
    __syncthreads();
    if ((int)threadIdx.x < nrows) {
        float s = 0.f;
#pragma unroll 7
        for (int c = 0; c < COLS; ++c) s += to_f(tile[threadIdx.x * COLS + c]);
        y[r0 + threadIdx.x] = from_f<TO>(s / (float)COLS);
    }
}

/* One warp per row. */
template <typename TX, typename TO, int THREADS>
__global__ void __launch_bounds__(THREADS) mean_warp(const TX* __restrict__ x, TO* __restrict__ y, int64_t rows, int cols) {
    const int64_t row = (int64_t)blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const TX* a = x + row * cols;
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += to_f(a[c]);
    s = warp_sum(s);
    if (lane == 0) y[row] = from_f<TO>(s / (float)cols);
}
//@section windows

__device__ __forceinline__ void windows(const TX* plane, int row0, int oh, int ow0, float (&best)[OWV],
                                        int64_t (&bi)[OWV]) {
    int hs = oh * SH - PH;
    const int he = min(hs + (KH - 1) * DH + 1, H);
    while (hs < 0) hs += DH;
    int wsj[OWV], wej[OWV];
#pragma unroll
    for (int j = 0; j < OWV; ++j) {
        int w0 = (ow0 + j) * SW - PW;
        wej[j] = min(w0 + (KW - 1) * DW + 1, W);
        while (w0 < 0) w0 += DW;
        wsj[j] = w0;
        best[j] = -INFINITY;
        bi[j] = (int64_t)hs * W + w0;
    }
    for (int ih = hs; ih < he; ih += DH) {
        const TX* rowp = plane + (int64_t)(ih - row0) * W;
#pragma unroll
        for (int j = 0; j < OWV; ++j)
            for (int iw = wsj[j]; iw < wej[j]; iw += DW) {
                const float v = to_f(rowp[iw]);
                if (v > best[j] || v != v) { best[j] = v; bi[j] = (int64_t)ih * W + iw; }
            }
    }
}

/* The values leave as one OWV-wide store, the indices as 16-byte stores. */
__device__ __forceinline__ void store_out(TO* __restrict__ y, int64_t* __restrict__ idx, int64_t o,
                                          const float (&best)[OWV], const int64_t (&bi)[OWV]) {
    if constexpr (OWV > 1) store_vec<TO, OWV>(y + o, best);
    else y[o] = from_f<TO>(best[0]);
    if (idx == nullptr) return;
    if constexpr (OWV > 1) {
#pragma unroll
        for (int j = 0; j < OWV; j += 2) *reinterpret_cast<longlong2*>(idx + o + j) = make_longlong2(bi[j], bi[j + 1]);
    } else {
        idx[o] = bi[0];
    }
}
//@section tile

__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y ${idx_param}) {
    __shared__ __align__(16) TX tile[IN_ROWS * W];
    const int64_t nc = blockIdx.x / TILES;
    const int oh0 = (int)(blockIdx.x % TILES) * ROWS;
    const int oh1 = min(oh0 + ROWS, OH);
    const int ih0 = max(oh0 * SH - PH, 0);
    const int ih1 = min((oh1 - 1) * SH - PH + (KH - 1) * DH + 1, H);
    const TX* src = x + nc * H * W + (int64_t)ih0 * W;
    const int n = (ih1 - ih0) * W;
    for (int k = threadIdx.x * VEC; k < n; k += THREADS * VEC)
        *reinterpret_cast<Vec<TX, VEC>*>(tile + k) = *reinterpret_cast<const Vec<TX, VEC>*>(src + k);
    __syncthreads();
    const int items = (oh1 - oh0) * (OW / OWV);
    for (int q = threadIdx.x; q < items; q += THREADS) {
        const int oh = oh0 + q / (OW / OWV), ow0 = (q % (OW / OWV)) * OWV;
        float best[OWV];
        int64_t bi[OWV];
        windows(tile, ih0, oh, ow0, best, bi);
        store_out(y, ${idx}, (nc * OH + oh) * OW + ow0, best, bi);
    }
}
//@section strip

__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y ${idx_param}) {
    constexpr int NV = 2 * OWV;
    const int64_t q0 = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    const bool live = q0 < TOTAL / OWV;
    const int64_t q = live ? q0 : 0;
    const int k = (int)(q % (OW / OWV)), oh = (int)((q / (OW / OWV)) % OH);
    const int64_t nc = q / ((int64_t)(OW / OWV) * OH);
    const int c0 = k * NV;
    const int lane = threadIdx.x & 31;
    const TX* plane = x + nc * H * W;
    int hs = oh * SH - PH;
    while (hs < 0) hs += DH;
    float best[OWV];
    int64_t bi[OWV];
#pragma unroll
    for (int j = 0; j < OWV; ++j) {
        best[j] = -INFINITY;
        bi[j] = (int64_t)hs * W + (j == 0 && k == 0 ? 0 : c0 + 2 * j - 1);
    }
#pragma unroll
    for (int r = 0; r < KH; ++r) {
        const int ih = oh * SH - PH + r * DH;
        const bool ok = live && ih >= 0 && ih < H;
        float v[NV];
        if (ok) {
            const Vec<TX, NV> a = *reinterpret_cast<const Vec<TX, NV>*>(plane + (int64_t)ih * W + c0);
#pragma unroll
            for (int e = 0; e < NV; ++e) v[e] = to_f(a.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < NV; ++e) v[e] = -INFINITY;
        }
        float left = __shfl_up_sync(0xffffffffu, v[NV - 1], 1);
        if (lane == 0 || k == 0) left = (ok && k > 0) ? to_f(plane[(int64_t)ih * W + c0 - 1]) : -INFINITY;
        const int64_t rowi = (int64_t)ih * W + c0;
#pragma unroll
        for (int j = 0; j < OWV; ++j) {
            const float a0 = j == 0 ? left : v[2 * j - 1], a1 = v[2 * j], a2 = v[2 * j + 1];
            if (a0 > best[j] || a0 != a0) { best[j] = a0; bi[j] = rowi + 2 * j - 1; }
            if (a1 > best[j] || a1 != a1) { best[j] = a1; bi[j] = rowi + 2 * j; }
            if (a2 > best[j] || a2 != a2) { best[j] = a2; bi[j] = rowi + 2 * j + 1; }
        }
    }
    if (!live) return;
    store_out(y, ${idx}, (nc * OH + oh) * OW + (int64_t)k * OWV, best, bi);
}
//@section owv

__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y ${idx_param}) {
    const int64_t q = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (q >= TOTAL / OWV) return;
    const int ow0 = (int)(q % (OW / OWV)) * OWV, oh = (int)((q / (OW / OWV)) % OH);
    const int64_t nc = q / ((int64_t)(OW / OWV) * OH);
    float best[OWV];
    int64_t bi[OWV];
    windows(x + nc * H * W, 0, oh, ow0, best, bi);
    store_out(y, ${idx}, (nc * OH + oh) * OW + ow0, best, bi);
}
//@section thread

__global__ void __launch_bounds__(THREADS) maxpool(const TX* __restrict__ x, TO* __restrict__ y ${idx_param}) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int64_t o = ((int64_t)blockIdx.x * PER + u) * THREADS + threadIdx.x;
        if (o >= TOTAL) return;
        const int ow = (int)(o % OW), oh = (int)((o / OW) % OH);
        const int64_t nc = o / ((int64_t)OW * OH);
        float best[1];
        int64_t bi[1];
        windows(x + nc * H * W, 0, oh, ow, best, bi);
        store_out(y, ${idx}, o, best, bi);
    }
}
