/* Scalar helpers the generated kernels and the elementwise family call, written once for both
   backends: FG is the function qualifier each defines first. */

//@section helpers

FG float fg_max(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
FG float fg_min(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
/* the reductions' combinations: NaN sticks */
FG float fg_max_acc(float a, float b) { return (a > b || a != a) ? a : b; }
FG float fg_min_acc(float a, float b) { return (a < b || a != a) ? a : b; }
FG float fg_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
FG float fg_silu(float x) { return x / (1.f + expf(-x)); }
FG float fg_gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
FG float fg_gelu_tanh(float x) {
    const float k = 0.79788456080286536f;
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}
FG float fg_relu(float x) { return x != x ? x : (x > 0.f ? x : 0.f); }
FG float fg_clamp(float x, float lo, float hi) { return x != x ? x : (x < lo ? lo : (x > hi ? hi : x)); }
FG float fg_softplus(float x, float beta, float th) { return x * beta > th ? x : log1pf(expf(x * beta)) / beta; }
FG float fg_leaky_relu(float x, float s) { return x > 0.f ? x : x * s; }
FG float fg_elu(float x, float a, float sc, float isc) { return x > 0.f ? x * sc : expm1f(x * isc) * a * sc; }
FG float fg_hardsigmoid(float x) { return fg_clamp(x + 3.f, 0.f, 6.f) / 6.f; }
FG float fg_hardswish(float x) { return x * fg_clamp(x + 3.f, 0.f, 6.f) / 6.f; }
FG float fg_mish(float x) { return x * tanhf(log1pf(expf(x))); }
FG float fg_sign(float x) { return x != x ? x : (float)((x > 0.f) - (x < 0.f)); }
