/* The generated C++ kernels' prelude (forge_tui/codegen/emit_cpu.py): FG, the helpers' qualifier,
   and the roundings and rsqrt the expressions call, between cpu_common.h and the shared helpers. */

//@section head

#define FG static inline
FG float fg_rbf(float v) { return round_to<fbf16>(v); }
FG float fg_rh(float v) { return round_to<fhalf>(v); }
FG float fg_rsqrt(float v) { return 1.f / sqrtf(v); }
