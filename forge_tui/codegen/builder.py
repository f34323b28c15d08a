"""The builder: turns values asked at an index into the nodes of the kernel's scalar graph,
converting operands as eager does (TensorIterator's common dtype, Python numbers at opmath)."""

from __future__ import annotations

from typing import Any

from .index import Index, IndexError_, Space, evaluate
from .ir import FLOAT_OPS, Graph, kind
from .values import Num, RedVal, Unsupported, Val


class Builder:
    def __init__(self, space: Space, rows: int, cols: int, column: Index | None = None) -> None:
        self.space = space
        self.rows, self.cols = rows, cols
        self.g = Graph()
        self.memo: dict[tuple[int, tuple[Index, ...]], int] = {}
        self.red_nodes: dict[int, int] = {}
        self.flat = space.add(space.scale(space.var("r"), cols), column if column is not None else space.var("c"))
        """The element a (row, column) visits: ``column`` is the logical column as a function of
        the loop variable c (``column_order``), c itself by default."""
        self._rows_ok: dict[Index, bool] = {}

    def pull(self, v: Val, idx: tuple[Index, ...]) -> int:
        key = (id(v), tuple(idx))
        hit = self.memo.get(key)
        if hit is None:
            try:
                hit = v.at(self, tuple(idx))
            except IndexError_ as exc:
                raise Unsupported(f"{v.where}: {exc}") from None
            self.memo[key] = hit
        return hit

    def is_row(self, e: Index) -> bool:
        """Whether ``e`` is the row index r for every row (canonically, else checked row by row)."""
        r = self.space.var("r")
        if e == r:
            return True
        if e.vars() - {"r"}:
            return False
        ok = self._rows_ok.get(e)
        if ok is None:
            import torch

            rr = torch.arange(self.rows, dtype=torch.int64)
            got = evaluate(e, {"r": rr})
            ok = bool(torch.equal(torch.as_tensor(got, dtype=torch.int64).expand(self.rows), rr))
            self._rows_ok[e] = ok
        return ok

    def reduction_node(self, rv: RedVal) -> int:
        node = self.red_nodes.get(id(rv))
        if node is None:
            if rv.cols != self.cols or rv.src.numel != self.rows * self.cols:
                raise Unsupported(f"{rv.where}: reduces rows of {rv.cols} where the kernel's rows have {self.cols}")
            body = self.pull(rv.src, tuple(self.space.delinearize(self.flat, rv.src.shape)))
            body = self.cast(body, "float32")
            node = self.red_nodes[id(rv)] = self.g.reduction(rv.kind, body)
        return node

    # ---- scalars ---------------------------------------------------------------------------------
    def const(self, value, dtype: str) -> int:
        k = kind(dtype)
        if k == "f":
            v: Any = float(value)
        elif k == "i":
            v = int(value)
        else:
            v = bool(value)
        return self.g.add("const", (), v, dtype, varying=False)

    def cast(self, node: int, dtype: str, attr=None) -> int:
        """``attr``: EXPLICIT for the model's own casts (``.to``, ``type_as``, copies), which
        round in every ``math`` mode; None for an op's rounding of its result."""
        n = self.g.nodes[node]
        if n.dtype == dtype:
            return node
        src, dst = n.kind, kind(dtype)
        if src == "f" and dst == "i":
            raise Unsupported("a cast from floating point to an integer type")
        return self.g.add("cast", (node,), attr if src == "f" and dst == "f" else None, dtype)

    def apply(self, op: str, ops: list, attr, dtype: str, where: str) -> int:
        """The node of ``op`` on operand nodes (ints) or Python numbers, result of ``dtype``."""
        g = self.g
        if op == "cast":
            return self.cast(ops[0], dtype, attr)
        if op == "where":
            cond = self.operand(ops[0], "bool")
            return g.add("where", (cond, self.operand(ops[1], dtype), self.operand(ops[2], dtype)), None, dtype)
        k = kind(dtype)
        if op in ("logical_not", "logical_and", "logical_or", "logical_xor"):
            return g.add(op, tuple(self.operand(x, "bool") for x in ops), None, "bool")
        if k == "b":  # comparisons and predicates
            kinds = {_py_kind(x) if isinstance(x, Num) else self.g.nodes[x].kind for x in ops}
            if "f" in kinds:
                common = "float32"
            elif "i" in kinds:
                common = "int64"
            else:
                common = "bool"
            if common == "bool" and op not in ("eq", "ne"):
                common = "int64"
            return g.add(op, tuple(self.operand(x, common) for x in ops), attr, "bool")
        if k == "i":
            if op not in ("add", "sub", "mul", "neg", "abs", "maximum", "minimum"):
                raise Unsupported(f"{where}: integer {op}")
            return g.add(op, tuple(self.operand(x, "int64") for x in ops), None, dtype)
        if op not in FLOAT_OPS:
            raise Unsupported(f"{where}: no scalar form of {op}")
        return g.add(op, tuple(self.operand(x, dtype) for x in ops), attr, dtype)

    def operand(self, x, dtype: str) -> int:
        """An operand converted to the op's dtype (Python numbers: to the opmath type, unrounded)."""
        if isinstance(x, Num):
            k = kind(dtype)
            return self.const(x.value, "float32" if k == "f" else "int64" if k == "i" else "bool")
        return self.cast(x, dtype)



def _py_kind(x) -> str:
    x = x.value if isinstance(x, Num) else x
    if isinstance(x, bool):
        return "b"
    if isinstance(x, int):
        return "i"
    return "f"

