"""A reference interpreter of a :class:`~.ir.Kernel` in torch: every node evaluated over the whole
``rows x cols`` domain at once, in fp32 and rounded to its dtype, as the emitted kernels compute
it. It checks the analysis (indexing, broadcasting, the lowering of composite ops, the roundings)
against eager without compiling anything; the emitters' C is checked by compiling it."""

from __future__ import annotations

from ..tensorstore import span
from .index import evaluate
from .ir import BOOL_OPS, FLOAT_OPS, INT_OPS, Kernel


def run_kernel(kern: Kernel, inputs: list, outputs: list) -> None:
    """Compute the kernel on ``inputs`` into the preallocated ``outputs`` (the card's tensors)."""
    import torch

    dev = inputs[0].device if inputs else "cpu"
    env = {"r": torch.arange(kern.rows, device=dev).view(-1, 1), "c": torch.arange(kern.cols, device=dev).view(1, -1)}
    vals: dict[int, torch.Tensor] = {}
    reds: dict[int, torch.Tensor] = {}

    def idx(e):
        v = evaluate(e, env)
        return torch.as_tensor(v, device=dev, dtype=torch.int64)

    def full(t):
        return t.expand(kern.rows, kern.cols)

    def value(n: int):
        hit = vals.get(n)
        if hit is not None:
            return hit
        node = kern.nodes[n]
        a = [value(x) for x in node.args]
        if node.op == "load":
            k, off = node.attr
            st = span(inputs[k])
            v = st[idx(off)]
            v = v.float() if node.kind == "f" else v.to(torch.int64) if node.kind == "i" else v.bool()
        elif node.op == "const":
            v = torch.tensor(node.attr, device=dev, dtype=torch.float32 if node.kind == "f" else
                             torch.int64 if node.kind == "i" else torch.bool).view(1, 1)
            if node.kind == "f":
                v = v.to(getattr(torch, node.dtype)).float()
        elif node.op == "index":
            v = idx(node.attr)
        elif node.op == "icmp":
            lhs, op, rhs = node.attr
            x, y = idx(lhs), idx(rhs)
            v = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y}[op]
        elif node.op == "red":
            v = reds.get(node.attr)
            if v is None:
                r = kern.reductions[node.attr]
                body = full(value(r.body))
                if r.kind == "sum":
                    v = body.double().sum(1, keepdim=True).float()
                elif r.kind == "amax":
                    v = body.amax(1, keepdim=True)
                    v = torch.where(body.isnan().any(1, keepdim=True), float("nan"), v)
                else:
                    v = body.amin(1, keepdim=True)
                    v = torch.where(body.isnan().any(1, keepdim=True), float("nan"), v)
                reds[node.attr] = v
        elif node.op == "cast":
            x = a[0]
            if node.kind == "f":
                v = x.float()
            elif node.kind == "b":
                v = x != 0
            else:
                v = x.to(getattr(torch, node.dtype)).to(torch.int64)
        elif node.op == "where":
            v = torch.where(a[0], a[1], a[2])
        elif node.kind == "b" and node.op in BOOL_OPS and all(kern.nodes[x].kind == "b" for x in node.args):
            v = {"logical_not": lambda: ~a[0], "logical_and": lambda: a[0] & a[1], "logical_or": lambda: a[0] | a[1],
                 "logical_xor": lambda: a[0] ^ a[1], "eq": lambda: a[0] == a[1], "ne": lambda: a[0] != a[1]}[node.op]()
        elif all(kern.nodes[x].kind == "i" for x in node.args) and node.op in INT_OPS:
            v = {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "mul": lambda: a[0] * a[1],
                 "neg": lambda: -a[0], "abs": lambda: a[0].abs(), "maximum": lambda: torch.maximum(a[0], a[1]),
                 "minimum": lambda: torch.minimum(a[0], a[1]), "eq": lambda: a[0] == a[1], "ne": lambda: a[0] != a[1],
                 "lt": lambda: a[0] < a[1], "le": lambda: a[0] <= a[1], "gt": lambda: a[0] > a[1],
                 "ge": lambda: a[0] >= a[1]}[node.op]()
        else:
            op = FLOAT_OPS[node.op]
            attrs = tuple(node.attr) if node.attr is not None else ()
            v = op.torch(*a, *attrs)
        if node.kind == "f" and node.op not in ("load", "const"):
            v = v.float().to(getattr(torch, node.dtype)).float()
        vals[n] = v
        return v

    for o in kern.outputs:
        v = value(o.node)
        t = outputs[o.index]
        st = span(t)
        if o.per_row:
            off = idx(o.offset).expand(kern.rows, 1)
            v = v.expand(kern.rows, 1)
        else:
            off = idx(o.offset).expand(kern.rows, kern.cols)
            v = full(v)
        st[off.reshape(-1)] = v.reshape(-1).to(t.dtype)


def interpret(kern: Kernel, card, inputs: list) -> list:
    """The card's outputs computed by the interpreter."""
    from ..kernel_abi import alloc_outputs

    outs = alloc_outputs(card.outputs, inputs[0].device.type if inputs else "cpu")
    for k in kern.domains:
        run_kernel(k, inputs, outs)
    return outs
