"""Row normalisations over the last dimension, one pass with the row in registers:

  layer_norm  ``aten.native_layer_norm`` (optional weight and bias; writes y, mean and rstd);
  rms_norm    a leaf module whose program is the Hugging Face RMSNorm (upcast, pow, mean, add eps,
              rsqrt, mul, cast back, scale), fused into one kernel with eager's roundings.

The CUDA code is in rownorm.cuh (device) and rownorm.cu (entry point), the C++ in rownorm.cpp.
"""

from __future__ import annotations

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.source import KernelFile
from ..base import CTYPE, FLOAT_DTYPES, input_index, numel, vec_widths

CUH = KernelFile(__package__, "rownorm.cuh")
CU = KernelFile(__package__, "rownorm.cu")
CPP = KernelFile(__package__, "rownorm.cpp")
RMS_OPS = {"aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.add.Scalar",
           "aten.rsqrt.default", "aten.mul.Tensor"}


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def match_rms(card: Card) -> dict | None:
    """The HF RMSNorm program: y = w * cast(x32 * rsqrt(mean(x32^2, -1) + eps)). None otherwise."""
    if card.kind != CardKind.MODULE or len(card.outputs) != 1:
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
    if card.kind != CardKind.OP or card.target != "aten.native_layer_norm.default" or len(card.outputs) != 3:
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


def _rows(i: dict) -> str:
    """The rows a call normalises: the card's count, or for a range card the call's own, from its
    input's elements (its rows' length is fixed)."""
    return f"forge_numel(&in[{i['x']}]) / COLS" if i.get("ranged") else str(i["rows"])


class RowNorm(Family):
    name = "rownorm"

    def range_reason(self, m: Match) -> str | None:
        """A range over the rows is served (their count is read from the input at run time); one
        over a row's length is not (it sizes each thread's registers at compile time)."""
        x = m.card.inputs[m.info["x"]]
        last = f"input{m.info['x']}.dim{len(x.shape) - 1}"
        if last in m.card.ranges or any(k.startswith("input") and not k.startswith(f"input{m.info['x']}.")
                                        for k in m.card.ranges):
            return "rownorm: a row's length (and a weight's) is fixed when the kernel is compiled"
        return None

    def match(self, card: Card) -> Match | None:
        info = match_rms(card) or match_layer_norm(card)
        if info is None or info["cols"] > 1024 * 32:
            return None
        return Match("rms_norm" if info["kind"] == "rms" else "layer_norm", card, {**info, "ranged": bool(card.ranges)})

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
        eps = f"(float){i['eps']!r}"
        if i["kind"] == "rms":
            inputs = f"const TX* x = (const TX*)in[{i['x']}].data; const TW* w = (const TW*)in[{i['w']}].data;"
            types = CPP.inline("rms_types", tx=ct[i["tin"]], tw=ct[i["tw"]], to=ct[i["tout"]], tm=ct[i["tmid"]])
            outs, body = "", CPP.inline("rms_body", eps=eps)
        else:
            inputs = f"const TX* x = (const TX*)in[{i['x']}].data;"
            inputs += f" const TW* w = (const TW*)in[{i['w']}].data;" if i["w"] is not None else " const TW* w = nullptr;"
            inputs += f" const TB* b = (const TB*)in[{i['b']}].data;" if i["b"] is not None else " const TB* b = nullptr;"
            types = CPP.inline("ln_types", tx=ct[i["tin"]], tw=ct[i["tw"]], tb=ct[i["tb"]], to=ct[i["tout"]],
                               ts=ct[i["tstat"]])
            outs, body = CPP.inline("ln_outs"), CPP.inline("ln_body", eps=eps)
        return CPU_COMMON + CPP.fill("entry", types=types, rows=_rows(i), cols=i["cols"], x=i["x"], inputs=inputs,
                                     outs=outs, chunk=p["chunk"], body=body)

    # ---- CUDA --------------------------------------------------------------------------------------
    def _cuda(self, m: Match, p: dict) -> str:
        i = m.info
        tpr, rpb, vec = p["tpr"], p["rpb"], p["vec"]
        cols, rows = i["cols"], i["rows"]
        ct = CTYPE
        if i["kind"] == "rms":
            types = CU.inline("rms_types", tx=ct[i["tin"]], tw=ct[i["tw"]], to=ct[i["tout"]], tm=ct[i["tmid"]])
            args = f"(const TX*)in[{i['x']}].data, (const TW*)in[{i['w']}].data, (TO*)out[0].data"
            kernel = "rms_norm_regs"
            ptrs = f"in[{i['x']}].data, in[{i['w']}].data, out[0].data"
            extra_t = "TM"
        else:
            types = CU.inline("ln_types", tx=ct[i["tin"]], tw=ct[i["tw"]], tb=ct[i["tb"]], to=ct[i["tout"]],
                              ts=ct[i["tstat"]])
            wp = f"(const TW*)in[{i['w']}].data" if i["w"] is not None else "(const TW*)nullptr"
            bp = f"(const TB*)in[{i['b']}].data" if i["b"] is not None else "(const TB*)nullptr"
            args = f"(const TX*)in[{i['x']}].data, {wp}, {bp}, (TO*)out[0].data, (TS*)out[1].data, (TS*)out[2].data"
            kernel = "layer_norm_regs"
            ptrs = f"in[{i['x']}].data, out[0].data" + (f", in[{i['w']}].data" if i["w"] is not None else "") + \
                (f", in[{i['b']}].data" if i["b"] is not None else "")
            extra_t = "TB, TS"
        checks = " && ".join(f"forge_aligned({q}, {vec} * 4)" for q in ptrs.split(", "))
        return CUDA_COMMON + CUH.section("kernels") + CU.fill(
            "entry", types=types, rows=_rows(i), cols=cols, x=i["x"], checks=checks, kernel=kernel,
            tparams=f"TX, TW, {extra_t}, TO", tpr=tpr, rpb=rpb, vec=vec, nv=-(-cols // (tpr * vec)), nv1=-(-cols // tpr),
            blocks=f"(unsigned)((ROWS + {rpb - 1}) / {rpb})" if i.get("ranged") else -(-rows // rpb),
            threads=tpr * rpb, args=args, eps=f"(float){i['eps']!r}")
