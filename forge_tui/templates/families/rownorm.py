"""Row normalisations over the last dimension, one pass with the row in registers:

  layer_norm  ``aten.native_layer_norm`` (optional weight and bias; writes y, mean and rstd);
  rms_norm    a leaf module whose program is the Hugging Face RMSNorm (upcast, pow, mean, add eps,
              rsqrt, mul, cast back, scale), fused into one kernel with eager's roundings.
"""

from __future__ import annotations

from ...cards import Card
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ..base import CTYPE, FLOAT_DTYPES, input_index, numel, vec_widths

RMS_OPS = {"aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.add.Scalar",
           "aten.rsqrt.default", "aten.mul.Tensor"}


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def match_rms(card: Card) -> dict | None:
    """The HF RMSNorm program: y = w * cast(x32 * rsqrt(mean(x32^2, -1) + eps)). None otherwise."""
    if card.kind != "module" or len(card.outputs) != 1:
        return None
    nodes = card.program["nodes"]
    ops = [n["op"] for n in nodes]
    if not set(ops) <= RMS_OPS or ops.count("aten.rsqrt.default") != 1 or ops.count("aten.mean.dim") != 1:
        return None
    xs = [i for i, s in enumerate(card.inputs) if s.role == "input"]
    ws = [i for i, s in enumerate(card.inputs) if s.role == "param"]
    if len(xs) != 1 or len(ws) != 1 or len(card.inputs) != 2:
        return None
    x, w = card.inputs[xs[0]], card.inputs[ws[0]]
    if len(w.shape) != 1 or x.shape[-1] != w.shape[0] or not x.contiguous or not card.outputs[0].contiguous:
        return None
    pw = next(n for n in nodes if n["op"] == "aten.pow.Tensor_Scalar")
    mean = next(n for n in nodes if n["op"] == "aten.mean.dim")
    add = [n for n in nodes if n["op"] in ("aten.add.Tensor", "aten.add.Scalar")]
    if pw["args"][1] != 2 or mean["args"][1] not in ([-1], [len(x.shape) - 1]) or len(add) != 1:
        return None
    eps = add[0]["args"][1]
    if not isinstance(eps, (int, float)):
        return None
    # which dtype the normalised value is cast to before the weight multiply
    muls = [n for n in nodes if n["op"] == "aten.mul.Tensor"]
    last = nodes[-1]
    if last["op"] != "aten.mul.Tensor" or not any(input_index(a) == ws[0] for a in last["args"][:2]):
        return None
    other = next(a for a in last["args"][:2] if input_index(a) != ws[0])
    mid_dtype = "float32"
    if isinstance(other, dict) and "$node" in other:
        meta = nodes[other["$node"]].get("out") or []
        if meta and meta[0]:
            mid_dtype = meta[0][1]
    if x.dtype not in FLOAT_DTYPES or w.dtype not in FLOAT_DTYPES or len(muls) < 2:
        return None
    cols = x.shape[-1]
    return {"kind": "rms", "rows": numel(x.shape) // cols, "cols": cols, "tin": x.dtype, "tw": w.dtype,
            "tout": card.outputs[0].dtype, "tmid": mid_dtype, "eps": float(eps), "x": xs[0], "w": ws[0]}


def match_layer_norm(card: Card) -> dict | None:
    if card.kind != "op" or card.target != "aten.native_layer_norm.default" or len(card.outputs) != 3:
        return None
    node = card.program["nodes"][0]
    args = node["args"]
    xi, shape, wref, bref, eps = args[0], args[1], args[2], args[3], args[4]
    xi = input_index(xi)
    if xi is None or not isinstance(shape, list):
        return None
    x = card.inputs[xi]
    cols = numel(shape)
    if x.dtype not in FLOAT_DTYPES or not x.contiguous or not card.outputs[0].contiguous or cols == 0:
        return None
    wi, bi = input_index(wref), input_index(bref)
    for i in (wi, bi):
        if i is not None and (not card.inputs[i].contiguous or numel(card.inputs[i].shape) != cols):
            return None
    return {"kind": "ln", "rows": numel(x.shape) // cols, "cols": cols, "tin": x.dtype, "tout": card.outputs[0].dtype,
            "tstat": card.outputs[1].dtype, "eps": float(eps), "x": xi, "w": wi, "b": bi,
            "tw": card.inputs[wi].dtype if wi is not None else x.dtype,
            "tb": card.inputs[bi].dtype if bi is not None else x.dtype}


class RowNorm(Family):
    name = "rownorm"

    def match(self, card: Card) -> Match | None:
        info = match_rms(card) or match_layer_norm(card)
        if info is None or info["cols"] > 1024 * 32:
            return None
        return Match("rms_norm" if info["kind"] == "rms" else "layer_norm", card, info)

    def _vecs(self, m: Match) -> list[int]:
        return vec_widths(m.info["cols"], ITEMSIZE[m.info["tin"]])

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16, 64]}
        return {"tpr": [32, 64, 128, 256, 512, 1024], "rpb": [1, 2, 4, 8], "vec": self._vecs(m)}

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        cols = m.info["cols"]
        if p["tpr"] * p["rpb"] > 1024 or (p["rpb"] > 1 and p["tpr"] > 256) or p["vec"] not in self._vecs(m):
            return False
        nv = -(-cols // (p["tpr"] * p["vec"]))
        return nv * p["vec"] <= 32 and p["tpr"] * p["vec"] <= _pow2_ceil(cols) * 2

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 4}
        cols = m.info["cols"]
        vec = self._vecs(m)[0]
        # layer_norm's two block reductions (mean, then the squared deviations) favour fewer
        # threads a row: 32 elements a thread; rms_norm's one reduction keeps up with a copy at 16
        # (docs/benchmarks.md)
        per_thread = 32 if m.info["kind"] == "ln" else 16
        tpr = min(1024, max(32, _pow2_ceil(-(-cols // per_thread))))
        while tpr * vec > _pow2_ceil(cols) and tpr > 32:
            tpr //= 2
        while -(-cols // (tpr * vec)) * vec > 32 and tpr < 1024:
            tpr *= 2
        rpb = max(1, min(8, 256 // tpr)) if tpr <= 128 else 1
        if m.info["kind"] == "ln" and tpr >= 128:
            rpb = 1  # a row a block at 128 threads, not two: the faster layout for layer_norm
        return {"tpr": tpr, "rpb": rpb, "vec": vec}

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        head = header(m.family, p, 1)
        return head + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p))

    # ---- CPU ---------------------------------------------------------------------------------------
    def _cpu(self, m: Match, p: dict) -> str:
        i = m.info
        ct = CPU_CTYPE
        if i["kind"] == "rms":
            inputs = f"const TX* x = (const TX*)in[{i['x']}].data; const TW* w = (const TW*)in[{i['w']}].data;"
            body = f'''
        double ss = 0.0;
        for (int64_t c = 0; c < COLS; ++c) {{ float v = to_f(a[c]); ss += v * v; }}
        const float rs = 1.f / std::sqrt((float)(ss / (double)COLS) + (float){i["eps"]!r});
        for (int64_t c = 0; c < COLS; ++c) o[c] = from_f<TO>(to_f(w[c]) * round_to<TM>(to_f(a[c]) * rs));'''
            types = f"typedef {ct[i['tin']]} TX; typedef {ct[i['tw']]} TW; typedef {ct[i['tout']]} TO; typedef {ct[i['tmid']]} TM;"
            outs = ""
        else:
            inputs = f"const TX* x = (const TX*)in[{i['x']}].data;"
            inputs += f" const TW* w = (const TW*)in[{i['w']}].data;" if i["w"] is not None else " const TW* w = nullptr;"
            inputs += f" const TB* b = (const TB*)in[{i['b']}].data;" if i["b"] is not None else " const TB* b = nullptr;"
            types = (f"typedef {ct[i['tin']]} TX; typedef {ct[i['tw']]} TW; typedef {ct[i['tb']]} TB; "
                     f"typedef {ct[i['tout']]} TO; typedef {ct[i['tstat']]} TS;")
            outs = "TS* mean_out = (TS*)out[1].data; TS* rstd_out = (TS*)out[2].data;"
            body = f'''
        double sum = 0.0;
        for (int64_t c = 0; c < COLS; ++c) sum += to_f(a[c]);
        const float mean = (float)(sum / (double)COLS);
        double var = 0.0;
        for (int64_t c = 0; c < COLS; ++c) {{ double d = to_f(a[c]) - mean; var += d * d; }}
        const float rstd = 1.f / std::sqrt((float)(var / (double)COLS) + (float){i["eps"]!r});
        for (int64_t c = 0; c < COLS; ++c) {{
            float v = (to_f(a[c]) - mean) * rstd;
            if (w) v *= to_f(w[c]);
            if (b) v += to_f(b[c]);
            o[c] = from_f<TO>(v);
        }}
        mean_out[r] = from_f<TS>(mean);
        rstd_out[r] = from_f<TS>(rstd);'''
        return CPU_COMMON + f'''
{types}
static const int64_t ROWS = {i["rows"]}, COLS = {i["cols"]};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[{i["x"]}]) != ROWS * COLS || !forge_is_contiguous(&out[0])) return 2;
    {inputs}
    TO* y = (TO*)out[0].data;
    {outs}
#pragma omp parallel for schedule(static, {p["chunk"]}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {{
        const TX* a = x + r * COLS;
        TO* o = y + r * COLS;{body}
    }}
    return 0;
}}
'''

    # ---- CUDA --------------------------------------------------------------------------------------
    def _cuda(self, m: Match, p: dict) -> str:
        i = m.info
        tpr, rpb, vec = p["tpr"], p["rpb"], p["vec"]
        cols, rows = i["cols"], i["rows"]
        nv = -(-cols // (tpr * vec))
        nv1 = -(-cols // tpr)
        blocks = -(-rows // rpb)
        ct = CTYPE
        if i["kind"] == "rms":
            types = f"typedef {ct[i['tin']]} TX; typedef {ct[i['tw']]} TW; typedef {ct[i['tout']]} TO; typedef {ct[i['tmid']]} TM;"
            args = f"(const TX*)in[{i['x']}].data, (const TW*)in[{i['w']}].data, (TO*)out[0].data"
            kernel = "rms_norm_regs"
            ptrs = f"in[{i['x']}].data, in[{i['w']}].data, out[0].data"
            extra_t = "TM"
        else:
            types = (f"typedef {ct[i['tin']]} TX; typedef {ct[i['tw']]} TW; typedef {ct[i['tb']]} TB; "
                     f"typedef {ct[i['tout']]} TO; typedef {ct[i['tstat']]} TS;")
            wp = f"(const TW*)in[{i['w']}].data" if i["w"] is not None else "(const TW*)nullptr"
            bp = f"(const TB*)in[{i['b']}].data" if i["b"] is not None else "(const TB*)nullptr"
            args = f"(const TX*)in[{i['x']}].data, {wp}, {bp}, (TO*)out[0].data, (TS*)out[1].data, (TS*)out[2].data"
            kernel = "layer_norm_regs"
            ptrs = f"in[{i['x']}].data, out[0].data" + (f", in[{i['w']}].data" if i["w"] is not None else "") + \
                (f", in[{i['b']}].data" if i["b"] is not None else "")
            extra_t = "TB, TS"
        checks = " && ".join(f"forge_aligned({q}, {vec} * 4)" for q in ptrs.split(", "))
        tparams = f"TX, TW, {extra_t}, TO"
        return CUDA_COMMON + KERNELS + f'''
{types}
static const int64_t ROWS = {rows};
static const int COLS = {cols};

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (forge_numel(&in[{i["x"]}]) != ROWS * COLS || !forge_is_contiguous(&out[0])) return 2;
    cudaStream_t s = (cudaStream_t)stream;
    const bool aligned = {checks};
    if (aligned) {kernel}<{tparams}, {tpr}, {rpb}, {vec}, {nv}><<<{blocks}, {tpr * rpb}, 0, s>>>({args}, ROWS, COLS, (float){i["eps"]!r});
    else {kernel}<{tparams}, {tpr}, {rpb}, 1, {nv1}><<<{blocks}, {tpr * rpb}, 0, s>>>({args}, ROWS, COLS, (float){i["eps"]!r});
    return (int)cudaGetLastError();
}}
'''


KERNELS = r'''
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
'''
