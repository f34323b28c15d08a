"""What both emitters share: the C expression of every node, the helpers they call, the checks a
candidate makes on its arguments."""

from __future__ import annotations

from ..kernel_abi import CPU_CTYPE, CUDA_CTYPE
from ..kernels.common import HALF
from .index import Index, to_c
from .ir import BOOL_OPS, EXPLICIT, FLOAT_OPS, FLOATS, INT_OPS, Kernel, Node, c_float

VALUE_TYPE = {"f": "float", "i": "int64_t", "b": "bool"}

# ``math`` = ``fast`` (cuda): the hardware's approximate functions in place of libm's, for
# programs whose float outputs are all half precision (their error, about 2^-11 relative, is a
# quarter of a bf16 rounding step)
FAST_C = {"tanh": "fg_tanh_fast({0})", "exp": "fg_exp_fast({0})", "sigmoid": "fg_sigmoid_fast({0})",
          "silu": "fg_silu_fast({0})", "gelu_tanh": "fg_gelu_tanh_fast({0})"}


def _output_nodes(kern: Kernel) -> set[int]:
    return {o.node for d in kern.domains for o in d.outputs}


def stored_only(kern: Kernel) -> set[int]:
    """Output nodes that no other node reads and that are stored in their own dtype: the store
    rounds them (``from_f``), so rounding them before is a second conversion of the same value."""
    hit = kern.memo.get("stored_only")
    if hit is None:
        used = {a for d in kern.domains for n in d.nodes for a in n.args}
        used |= {r.body for d in kern.domains for r in d.reductions}
        outs = [o for d in kern.domains for o in d.outputs]
        hit = kern.memo["stored_only"] = {o.node for o in outs if o.node not in used and all(
            p.dtype == kern.nodes[o.node].dtype for p in outs if p.node == o.node)}
    return set(hit)


def _casts_inside(kern: Kernel, outs: set[int]) -> bool:
    """Whether the model casts an fp32 value to half precision where the result is not an output
    (``x.float() ... .to(torch.bfloat16) * w``: what ``nocast`` leaves out)."""
    nodes = kern.nodes
    return any(n.op == "cast" and n.attr == EXPLICIT and n.kind == "f" and n.dtype in HALF and n.id not in outs
               and nodes[n.args[0]].kind == "f" and nodes[n.args[0]].dtype == "float32"
               for d in kern.domains for n in d.nodes)


def _rounds_inside(kern: Kernel, outs: set[int]) -> bool:
    """Whether an op that is not an output rounds its result to half precision (what ``fp32``
    leaves out; the model's own casts round in every mode but ``nocast``)."""
    def rounds(n: Node) -> bool:
        if n.op == "cast":
            return n.attr != EXPLICIT and kern.nodes[n.args[0]].kind == "f"
        return n.op in FLOAT_OPS and FLOAT_OPS[n.op].out == "f"

    return any(n.kind == "f" and n.dtype in HALF and n.id not in outs and rounds(n)
               for d in kern.domains for n in d.nodes)


def math_modes(kern: Kernel, backend: str) -> list[str]:
    """How a kernel may compute: ``eager`` rounds every op's result to its dtype, as eager does (bit
    for bit where eager is exact); ``fp32`` rounds only the outputs and explicit casts, keeping
    the rest in fp32 (fewer conversions: a bf16 NewGELU rounds eight times in eager); ``nocast``
    is ``fp32`` that also keeps in fp32 the model's own casts of fp32 values to half precision
    between ops, as torch.compile does by default (Inductor's ``emulate_precision_casts`` off: a
    Qwen-3 RMSNorm's ``.to(bf16)`` before its weight is one conversion an element); ``fast``
    (cuda) is ``fp32`` with approximate tanh, exp and sigmoid. Only the modes that differ from
    ``eager`` for this program are listed after it, nearest eager's results first (the order the
    search tries them in: ``fast`` last, since its approximate functions miss eager's tolerance on
    large chain cards such as the bundled decoder's, and a move spent on it is a move lost to the
    card); the evaluator judges each against eager."""
    key = "math_" + backend
    hit = kern.memo.get(key)
    if hit is None:
        outs = _output_nodes(kern)
        hit = ["eager"]
        floats = [o.dtype for d in kern.domains for o in d.outputs if o.dtype in FLOATS]
        if _rounds_inside(kern, outs):
            hit.append("fp32")
        if _casts_inside(kern, outs):
            hit.append("nocast")
        if backend == "cuda" and floats and all(dt in HALF for dt in floats) and any(
                n.op in FAST_C for d in kern.domains for n in d.nodes):
            hit.append("fast")
        kern.memo[key] = hit
    return list(hit)


class NodeWriter:
    """C statements for nodes: ``t<id>`` names each node's value; loads read ``p<k>`` at a row
    offset (``row_name``) plus their column part. ``math``: see ``math_modes`` (an output's value
    is rounded in every mode, so what later ops read of it is what was stored)."""

    def __init__(self, kern: Kernel, backend: str, math: str = "eager") -> None:
        self.k = kern
        self.backend = backend
        self.types = CUDA_CTYPE if backend == "cuda" else CPU_CTYPE
        self.row_offsets: dict[Index, str] = {}
        self.exact = math == "eager"
        self.fast = math == "fast"
        self.nocast = math == "nocast"
        self.outs = set() if self.exact else _output_nodes(kern)
        self.stored_only = stored_only(kern)

    # ---- offsets -----------------------------------------------------------------------------------
    def row_name(self, e: Index) -> str:
        """The row-scope variable holding the part of an offset that does not depend on c."""
        if not e.terms:
            return f"{e.const}LL"
        name = self.row_offsets.get(e)
        if name is None:
            name = self.row_offsets[e] = f"ro{len(self.row_offsets)}"
        return name

    def offset(self, e: Index) -> str:
        row, col = e.split("c")
        rn = self.row_name(row)
        if not col.terms:
            return rn
        return f"{rn} + {to_c(col)}"

    def row_decls(self) -> list[str]:
        return [f"const int64_t {name} = {to_c(e)};" for e, name in self.row_offsets.items()]

    # ---- values ------------------------------------------------------------------------------------
    def vtype(self, n: Node) -> str:
        return VALUE_TYPE[n.kind]

    def load_expr(self, n: Node) -> str:
        k, off = n.attr
        ref = f"p{k}[{self.offset(off)}]"
        if n.kind == "f":
            return f"to_f({ref})"
        if n.kind == "b":
            return f"(bool){ref}"
        return f"(int64_t){ref}"

    def round(self, dtype: str, expr: str) -> str:
        if dtype == "bfloat16":
            return f"fg_rbf({expr})"
        if dtype == "float16":
            return f"fg_rh({expr})"
        return expr

    def expr(self, n: Node) -> str:
        a = [f"t{x}" for x in n.args]
        nodes = self.k.nodes
        if n.op == "load":
            return self.load_expr(n)
        if n.op == "const":
            if n.kind == "f":
                return self.round(n.dtype, c_float(n.attr))
            if n.kind == "b":
                return "true" if n.attr else "false"
            return f"{int(n.attr)}LL"
        if n.op == "index":
            return f"(int64_t)({to_c(n.attr)})"
        if n.op == "icmp":
            lhs, op, rhs = n.attr
            return f"(({to_c(lhs)}) {op} ({to_c(rhs)}))"
        if n.op == "red":
            return f"red{n.attr}"
        if n.op == "cast":
            src = nodes[n.args[0]]
            x = a[0]
            if n.kind == "f":
                if src.kind == "b":
                    return f"({x} ? 1.f : 0.f)"
                if src.kind == "i":
                    return self.round(n.dtype, f"(float){x}")
                model_cast = n.attr == EXPLICIT and not (self.nocast and src.dtype == "float32")
                keep = self.exact or model_cast or n.id in self.outs
                return self.round(n.dtype, x) if n.dtype != src.dtype and keep and n.id not in self.stored_only else x
            if n.kind == "b":
                return f"({x} != 0)"
            ct = self.types[n.dtype]
            return f"(int64_t)({ct}){x}"
        if n.op == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        kinds = {nodes[x].kind for x in n.args}
        if kinds == {"b"} and n.op in BOOL_OPS:
            return BOOL_OPS[n.op].format(*a)
        if kinds == {"i"} and n.op in INT_OPS:
            return INT_OPS[n.op].format(*a)
        op = FLOAT_OPS[n.op]
        attrs = {f"a{i}": c_float(v) for i, v in enumerate(n.attr or ())}
        e = ((self.fast and FAST_C.get(n.op)) or op.c).format(*a, **attrs)
        if op.out == "b" or n.id in self.stored_only or not (self.exact or n.id in self.outs):
            return e
        return self.round(n.dtype, e)

    def stmt(self, n: Node, override: str | None = None) -> str:
        return f"const {self.vtype(n)} t{n.id} = {override if override is not None else self.expr(n)};"

    def store(self, dtype: str, ptr: str, value: str) -> str:
        if dtype in ("float32", "float16", "bfloat16"):
            return f"{ptr} = from_f<{self.types[dtype]}>({value});"
        return f"{ptr} = ({self.types[dtype]}){value};"


def check_inputs(kern: Kernel, card_inputs, card_outputs) -> str:
    """C statements returning 2 when the arguments are not the card's (count, shapes, strides)."""
    lines = [f"if (n_in != {len(card_inputs)} || n_out != {len(card_outputs)}) return 2;"]
    for which, specs in (("in", card_inputs), ("out", card_outputs)):
        for k, s in enumerate(specs):
            nd = len(s.shape)
            conds = [f"{which}[{k}].ndim != {nd}"]
            for d, (size, st) in enumerate(zip(s.shape, s.stride)):
                conds.append(f"{which}[{k}].shape[{d}] != {size}")
                if size > 1:
                    conds.append(f"{which}[{k}].stride[{d}] != {st}")
            lines.append(f"if ({' || '.join(conds)}) return 2;")
    return "\n    ".join(lines)
