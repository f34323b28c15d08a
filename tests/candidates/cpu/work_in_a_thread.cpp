// hands its work to a thread it starts and joins within the call (a thread that is gone when the
// call returns, so not counted among the runner's): 20 ms of that thread's CPU time, then a softmax.
// A clock that summed the runner's live threads would not see those 20 ms.
#include <cmath>
#include <ctime>
#include <thread>
#include "forge_kernel.h"
static void burn_20ms() {
    timespec t;
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); while (t.tv_sec == 0 && t.tv_nsec < 20000000L);
}
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    std::thread(burn_20ms).join();
    const int64_t cols = in[0].shape[in[0].ndim - 1], rows = forge_numel(&in[0]) / cols;
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (float)(std::exp((double)a[c] - m) / s);
    }
    return 0;
}
