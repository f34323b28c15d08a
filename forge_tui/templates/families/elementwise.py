"""Elementwise programs, fused: any card (op or module) whose program is a chain of pointwise
aten ops (activations, gates such as silu(a) * b and gelu(a) * b, bias adds, casts) becomes one
kernel. Each op is computed in fp32 and rounded to its own output dtype, as eager rounds between
kernels, so the fused result matches eager's. Inputs broadcast to the output (a bias, a
per-row scale); same-shape inputs are read with 16-byte vectors. ``math`` (as the generated
family's, see ``codegen.emit_common.math_modes``): ``fp32`` leaves out the ops' roundings inside
the chain (the model's own casts round), ``fast`` (cuda, half-precision output) also takes the
hardware's approximate tanh and exp; the result is rounded once, by its store. The fused kernel's
CUDA is in elementwise.cuh, its C++ in elementwise.cpp; the per-input lines are generated here.
"""

from __future__ import annotations

import re

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON, FAST_HELPERS, HALF
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.source import KernelFile
from ..base import CTYPE, FLOAT_DTYPES, numel, vec_widths

CUH = KernelFile(__package__, "elementwise.cuh")
CPP = KernelFile(__package__, "elementwise.cpp")
UNARY = {
    "neg": "(-{a})", "exp": "expf({a})", "log": "logf({a})", "sqrt": "sqrtf({a})", "rsqrt": "RSQRT({a})",
    "tanh": "tanhf({a})", "sigmoid": "(1.f / (1.f + expf(-{a})))", "abs": "fabsf({a})", "erf": "erff({a})",
    "relu": "(({a}) != ({a}) ? ({a}) : fmaxf({a}, 0.f))", "silu": "(({a}) / (1.f + expf(-({a}))))",
    "reciprocal": "(1.f / ({a}))", "clone": "({a})", "_to_copy": "({a})", "alias": "({a})",
    "sin": "sinf({a})", "cos": "cosf({a})",
}
GELU_NONE = "(0.5f * ({a}) * (1.f + erff(({a}) * 0.70710678118654752f)))"
GELU_TANH = ("(0.5f * ({a}) * (1.f + tanhf(0.79788456080286536f * (({a}) + 0.044715f * ({a}) * ({a}) * ({a})))))")
BINARY = {"mul": "(({a}) * ({b}))", "div": "(({a}) / ({b}))", "maximum": "MAXIMUM({a}, {b})",
          "minimum": "MINIMUM({a}, {b})"}
OVERLOADS = {"Tensor", "Scalar", "default", "self"}
FAST_RE = re.compile(r"\b(tanhf|expf)\(")
FAST_FN = {"tanhf(": "fg_tanh_fast(", "expf(": "fg_exp_fast("}


def _op(name: str) -> tuple[str, str]:
    _, op, overload = name.split(".", 2)
    return op.rstrip("_") if op.endswith("_") and not op.startswith("_") else op, overload


def _numel(i: dict) -> str:
    """The elements a call computes: the card's count, or a range card's call's own."""
    return "forge_numel(&out[0])" if i.get("ranged") else str(i["n"])


class Elementwise(Family):
    name = "elementwise"

    def _translate(self, card: Card) -> tuple[list[tuple[int, str, str, bool]], str] | None:
        """Per node, (k, its fp32 expression, its dtype, whether it is the model's cast), computing
        the output from inputs in0..inK (floats), and the result name."""
        nodes = card.program["nodes"]
        out_shape = card.outputs[0].shape
        lines: list[tuple[int, str, str, bool]] = []

        def ref(v) -> str | None:
            if isinstance(v, dict) and "$in" in v:
                return f"in{v['$in']}"
            if isinstance(v, dict) and "$node" in v and v.get("out", 0) == 0:
                return f"t{v['$node']}"
            if isinstance(v, bool):
                return None
            if isinstance(v, (int, float)):
                return f"{float(v)!r}f".replace("inff", "INFINITY")
            return None

        for k, node in enumerate(nodes):
            meta = node.get("out") or []
            if len(meta) != 1 or meta[0] is None or meta[0][1] not in FLOAT_DTYPES or meta[0][0] != out_shape:
                return None
            op, overload = _op(node["op"])
            if overload not in OVERLOADS:
                return None
            args, kw = node["args"], node.get("kwargs", {})
            a = ref(args[0]) if args else None
            if a is None:
                return None
            if op == "_to_copy":
                if set(kw) - {"dtype", "layout", "device", "memory_format", "non_blocking"}:
                    return None
                expr = a
            elif op in UNARY:
                if len(args) > 1:
                    return None
                expr = UNARY[op].format(a=a)
            elif op == "gelu":
                approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
                expr = (GELU_TANH if approx == "tanh" else GELU_NONE).format(a=a)
            elif op in ("add", "sub"):
                b = ref(args[1]) if len(args) > 1 else None
                alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
                if b is None or not isinstance(alpha, (int, float)):
                    return None
                sign = "+" if op == "add" else "-"
                expr = f"(({a}) {sign} ({b}))" if alpha == 1 else f"(({a}) {sign} {float(alpha)!r}f * ({b}))"
            elif op in BINARY:
                b = ref(args[1]) if len(args) > 1 else None
                if b is None or (op == "div" and kw.get("rounding_mode")):
                    return None
                expr = BINARY[op].format(a=a, b=b)
            elif op == "pow" and overload == "Tensor_Scalar":
                e = args[1]
                if e == 2:
                    expr = f"(({a}) * ({a}))"
                elif e == 0.5:
                    expr = f"sqrtf({a})"
                elif isinstance(e, (int, float)):
                    expr = f"powf({a}, {float(e)!r}f)"
                else:
                    return None
            else:
                return None
            lines.append((k, expr, meta[0][1], op == "_to_copy"))
        out = card.program["outputs"]
        if len(out) != 1 or "$node" not in out[0]:
            return None
        return lines, f"t{out[0]['$node']}"

    def match(self, card: Card) -> Match | None:
        if len(card.outputs) != 1 or not card.program.get("nodes"):
            return None
        y = card.outputs[0]
        if y.dtype not in FLOAT_DTYPES or not y.contiguous or numel(y.shape) == 0:
            return None
        if card.kind == CardKind.OP and "mutates" in card.flags and not card.target.split(".")[1].endswith("_"):
            return None
        tr = self._translate(card)
        if tr is None:
            return None
        # every input broadcasts to the output
        ins = []
        for s in card.inputs:
            if s.dtype not in FLOAT_DTYPES or len(s.shape) > len(y.shape):
                return None
            pad = len(y.shape) - len(s.shape)
            bstride = []
            for d, size in enumerate(y.shape):
                if d < pad:
                    bstride.append(0)
                    continue
                sz, st = s.shape[d - pad], s.stride[d - pad]
                if sz == size:
                    bstride.append(st if size > 1 else 0)
                elif sz == 1:
                    bstride.append(0)
                else:
                    return None
            same = s.shape == y.shape and s.contiguous
            ins.append({"dtype": s.dtype, "bstride": bstride, "same": same})
        if not any(i["same"] for i in ins):
            return None
        ranged = sorted(int(k.split(".dim")[1]) for k in card.ranges if k.startswith("output0."))
        fixed = numel([n for d, n in enumerate(y.shape) if d not in ranged])
        return Match(self.name, card, {"ins": ins, "lines": tr[0], "result": tr[1], "shape": y.shape,
                                       "n": numel(y.shape), "tout": y.dtype, "ranged": bool(card.ranges),
                                       "ranged_dims": ranged, "n_fixed": fixed})

    def range_reason(self, m: Match) -> str | None:
        """A range is served where the kernel's only size is the element count, read from the
        output at run time: every input of the output's shape, or broadcast along dimensions the
        range leaves fixed (a bias over the last one), each index then the same at every size."""
        i = m.info
        last = max(i["ranged_dims"], default=-1)
        for k, inp in enumerate(i["ins"]):
            if inp["same"]:
                mine = sorted(int(key.split(".dim")[1]) for key in m.card.ranges if key.startswith(f"input{k}."))
                if mine != i["ranged_dims"]:  # of the output's shape at one size, broadcast at another
                    return f"elementwise: input {k} does not range over the output's ranged dimensions"
                continue
            # the index of dimension d divides by the sizes after it: fixed only where none is ranged
            if any(key.startswith(f"input{k}.") for key in m.card.ranges) or \
                    any(st for d, st in enumerate(inp["bstride"]) if d <= last):
                return (f"elementwise: input {k} is broadcast along or outside a ranged dimension, "
                        "its index is compiled for one size")
        return None

    def _vecs(self, m: Match) -> list[int]:
        """Vector widths that divide the element count, at every size of a range card's range."""
        isz = min([ITEMSIZE[i["dtype"]] for i in m.info["ins"] if i["same"]] + [ITEMSIZE[m.info["tout"]]])
        return vec_widths(m.info["n_fixed"] if m.info.get("ranged") else m.info["n"], isz)

    @staticmethod
    def _modes(m: Match, backend: str) -> list[str]:
        i = m.info
        modes = ["eager"]  # nearest eager's results first, as the generator's (``math_modes``)
        if any(dt in HALF and not cast and f"t{k}" != i["result"] for k, _, dt, cast in i["lines"]):
            modes.append("fp32")
        if backend == "cuda" and i["tout"] in HALF and any(FAST_RE.search(e) for _, e, _, _ in i["lines"]):
            modes.append("fast")
        return modes

    def _code(self, m: Match, math: str) -> str:
        """The chain's statements: each op's result rounded to its dtype (``eager``), or only the
        model's casts (``fp32``, ``fast``); never the result, which the store rounds."""
        out = []
        for k, expr, dtype, cast in m.info["lines"]:
            if math == "fast":
                expr = FAST_RE.sub(lambda f: FAST_FN[f.group(0)], expr)
            if f"t{k}" != m.info["result"] and (math == "eager" or cast):
                expr = f"ROUND_{dtype.upper()}({expr})"
            out.append(f"const float t{k} = {expr};")
        return "\n            ".join(out)

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        ax: dict[str, list] = ({"chunk": [4096, 16384, 65536]} if backend == "cpu" else
                               {"threads": [128, 256, 512], "vec": self._vecs(m), "grid": ["full", "waves4", "waves1"]})
        modes = self._modes(m, backend)
        if len(modes) > 1:
            ax["math"] = modes
        return ax

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if p.get("math", "eager") not in self._modes(m, backend):
            return False
        return backend == "cpu" or p["vec"] in self._vecs(m)

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        p: dict = {"chunk": 16384} if backend == "cpu" else {"threads": 256, "vec": self._vecs(m)[0], "grid": "full"}
        if len(self._modes(m, backend)) > 1:
            p["math"] = "eager"
        return p

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def _index_expr(self, bstride: list[int], shape: list[int]) -> str:
        """Element index of a broadcast input for flat output index ``i`` (constants fold)."""
        terms = []
        inner = 1
        for d in range(len(shape) - 1, -1, -1):
            if bstride[d]:
                terms.append(f"((i / {inner}LL) % {shape[d]}LL) * {bstride[d]}LL")
            inner *= shape[d]
        return " + ".join(terms) if terms else "0"

    def _body(self, m: Match, ctype: dict, cuda: bool) -> tuple[str, str, str]:
        """(kernel parameter list, per-element loads for broadcast inputs, pointer arguments)."""
        i = m.info
        params, loads, args = [], [], []
        for k, inp in enumerate(i["ins"]):
            params.append(f"const {ctype[inp['dtype']]}* __restrict__ p{k}" if cuda else f"const {ctype[inp['dtype']]}* p{k}")
            args.append(f"(const {ctype[inp['dtype']]}*)in[{k}].data")
            if not inp["same"]:
                loads.append(f"const float in{k} = to_f(p{k}[{self._index_expr(inp['bstride'], i['shape'])}]);")
        return ", ".join(params), "\n            ".join(loads), ", ".join(args)

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        return header(self.name, p, 1) + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p, device))

    def _cpu(self, m: Match, p: dict) -> str:
        i = m.info
        params, loads, args = self._body(m, CPU_CTYPE, False)
        same = "\n            ".join(f"const float in{k} = to_f(p{k}[i]);" for k, inp in enumerate(i["ins"]) if inp["same"])
        return CPU_COMMON + CPP.section("rounding") + CPP.fill(
            "entry", to=CPU_CTYPE[i["tout"]], n=_numel(i), params=params, chunk=p["chunk"], same=same, loads=loads,
            comp=self._code(m, p.get("math", "eager")), result=i["result"], n_in=len(i["ins"]), args=args)

    def _cuda(self, m: Match, p: dict, device: DeviceProps) -> str:
        i = m.info
        threads, vec = p["threads"], p["vec"]
        params, loads, args = self._body(m, CTYPE, True)
        same_loads = "\n        ".join(f"float v{k}[VEC]; load_vec<{CTYPE[inp['dtype']]}, VEC>(p{k} + base, v{k});"
                                       for k, inp in enumerate(i["ins"]) if inp["same"])
        same_pick = "\n            ".join(f"const float in{k} = v{k}[j];" for k, inp in enumerate(i["ins"]) if inp["same"])
        n = i["n"]
        wave = device.sms * (device.max_threads_per_sm // threads)  # blocks resident on the GPU at once
        if i.get("ranged"):  # the grid from the call's element count
            full_v, full_1 = f"(NUMEL + {threads * vec - 1}) / {threads * vec}", f"(NUMEL + {threads - 1}) / {threads}"
            cap = {"full": None, "waves4": 4 * wave, "waves1": wave}[p["grid"]]
            grid: object = f"(unsigned)({full_v})" if cap is None else f"(unsigned)std::min<int64_t>({full_v}, {cap})"
            grid1: object = f"(unsigned)({full_1})" if cap is None else grid
        else:
            full = -(-n // (threads * vec))
            grid = {"full": full, "waves4": min(full, 4 * wave), "waves1": min(full, wave)}[p["grid"]]
            grid1 = -(-n // threads) if p["grid"] == "full" else grid
        aligned = " && ".join([f"forge_aligned(in[{k}].data, {vec * ITEMSIZE[inp['dtype']]})"
                               for k, inp in enumerate(i["ins"]) if inp["same"]]
                              + [f"forge_aligned(out[0].data, {vec * ITEMSIZE[i['tout']]})"])
        return CUDA_COMMON + CUH.section("rounding") + CUH.section("fg") + FAST_HELPERS + CUH.fill(
            "entry", to=CTYPE[i["tout"]], n=_numel(i), threads=threads, params=params, same_loads=same_loads,
            same_pick=same_pick, loads=loads, comp=self._code(m, p.get("math", "eager")), result=i["result"],
            n_in=len(i["ins"]), aligned=aligned, vec=vec, grid=grid, args=args,
            grid1=grid1)
