// reads a file outside its library (/etc/passwd, readable by everyone): returns 47 when the kernel
// refuses to open it (Landlock: the runner may read its library and nothing else), else computes.
#include <cmath>
#include <fcntl.h>
#include <unistd.h>
#include "forge_kernel.h"
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    int fd = open("/etc/passwd", O_RDONLY);
    if (fd < 0) return 47;
    close(fd);
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
