/* math = fast (cuda): the hardware's approximate tanh and exp in place of libm's, for programs
   whose float outputs are all half precision (their error, about 2^-11 relative, is a quarter
   of a bf16 rounding step). FG is the function qualifier the including code defines. */

//@section fast

FG float fg_tanh_fast(float x) { float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
FG float fg_exp_fast(float x) { return __expf(x); }
FG float fg_sigmoid_fast(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }
FG float fg_silu_fast(float x) { return __fdividef(x, 1.f + __expf(-x)); }
FG float fg_gelu_tanh_fast(float x) {
    const float k = 0.79788456080286536f;
    return 0.5f * x * (1.f + fg_tanh_fast(k * (x + 0.044715f * x * x * x)));
}
