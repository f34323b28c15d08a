/* Code every C++ (cpu backend) candidate starts with (forge_tui/kernels/common.py): the
   half-precision storage types and their conversions, branch-free exp and tanh. */

//@section common

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include "forge_kernel.h"

struct fbf16 { uint16_t bits; };
typedef _Float16 fhalf;

static inline float to_f(float v) { return v; }
static inline float to_f(double v) { return (float)v; }
static inline float to_f(fhalf v) { return (float)v; }
static inline float to_f(fbf16 v) { uint32_t u = (uint32_t)v.bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <typename T> static inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline fhalf from_f<fhalf>(float v) { return (fhalf)v; }
template <> inline fbf16 from_f<fbf16>(float v) {
    uint32_t u; std::memcpy(&u, &v, 4);
    fbf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) { r.bits = (uint16_t)((u >> 16) | 0x40); return r; }  /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                                        /* round to nearest even */
    r.bits = (uint16_t)(u >> 16);
    return r;
}
template <typename T> static inline float round_to(float v) { return to_f(from_f<T>(v)); }

/* exp and tanh in fp32 without branches, so that loops calling them vectorise (GCC calls scalar
   libm for expf/tanhf unless -ffast-math, which would break eager's rounding, infinities and NaN):
   Cephes' expf (Cody-Waite reduction by ln 2, a degree-6 polynomial, 2^n applied in two halves so
   results reach the denormals) and tanhf (x + x^3 P(x^2) below 0.625, 1 - 2 / (exp(2|x|) + 1)
   above). Within 1 ulp of PyTorch's on every float tried, infinities, NaN, overflow and underflow
   as libm; on a 2-core x86 machine 4x (exp) and 16x (tanh) faster than libm in a loop. Every
   expf(...) and tanhf(...) of a CPU kernel is one of these. */
static inline float fg_bits_f(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float fg_expf(float x) {
    float xc = x < -104.f ? -104.f : (x > 89.f ? 89.f : x);
    float n = rintf(xc * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float e = fmaf(p, r * r, r) + 1.f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    float y = e * fg_bits_f((n1 + 127) << 23) * fg_bits_f((n2 + 127) << 23);
    y = x > 88.72283935546875f ? INFINITY : y;
    return x != x ? x : y;
}
static inline float fg_tanhf(float x) {
    float a = fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = fmaf(p, z, 2.06390887954e-2f);
    p = fmaf(p, z, -5.37397155531e-2f);
    p = fmaf(p, z, 1.33314422036e-1f);
    p = fmaf(p, z, -3.33332819422e-1f);
    float small = copysignf(fmaf(p * z, a, a), x);  /* tanh(-0) is -0 */
    float big = copysignf(1.f - 2.f / (fg_expf(2.f * a) + 1.f), x);
    float y = a < 0.625f ? small : big;
    return x != x ? x : y;
}
#define expf(x) fg_expf(x)
#define tanhf(x) fg_tanhf(x)

/* Below this many elements a parallel region costs more than it saves (two OpenMP runtimes, the
   candidate's and PyTorch's, share the cores). */
static const int64_t PARALLEL_MIN = 1 << 16;
