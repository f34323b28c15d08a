"""Code shared by every CPU template: half-precision storage types and their conversions."""

COMMON = r'''
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

/* Below this many elements a parallel region costs more than it saves (two OpenMP runtimes, the
   candidate's and PyTorch's, share the cores). */
static const int64_t PARALLEL_MIN = 1 << 16;
'''
