"""A card's reference: a small, serialisable aten program and its interpreter.

A program is a list of aten calls whose arguments are JSON: tensors are references to the card's
inputs (``{"$in": k}``) or to an earlier call's outputs (``{"$node": i, "out": j}``); dtypes,
devices, layouts and memory formats are tagged values; numbers, strings, None and lists are plain.
Running it replays exactly what eager ran, so ``run_program(card.program, captured inputs)``
reproduces the captured outputs, on any device.
"""

from __future__ import annotations

import math
from typing import Any, Callable

_TAGS = ("$dtype", "$device", "$layout", "$memory_format", "$float")


class Unencodable(Exception):
    """An argument that has no JSON form (a generator, a Python object)."""


def encode(obj: Any, tensor_ref: Callable[[Any], dict]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return tensor_ref(obj)
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return {"$float": "nan"}
        if math.isinf(obj):
            return {"$float": "inf" if obj > 0 else "-inf"}
        return obj
    if isinstance(obj, torch.dtype):
        return {"$dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"$device": obj.type}
    if isinstance(obj, torch.layout):
        return {"$layout": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.memory_format):
        return {"$memory_format": str(obj).removeprefix("torch.")}
    if isinstance(obj, (list, tuple, torch.Size)):
        return [encode(x, tensor_ref) for x in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v, tensor_ref) for k, v in obj.items()}
    raise Unencodable(type(obj).__name__)


def _no_tensor(t: Any) -> dict:
    raise Unencodable("tensor")


def encodes_as(value: Any, recorded: Any) -> bool:
    """Whether a call's non-tensor argument encodes as the recorded one (a tensor never does):
    how a dtype, device, layout, memory format or special float is compared with a program's."""
    try:
        return bool(encode(value, _no_tensor) == recorded)
    except Unencodable:
        return False


def decode(obj: Any, resolve: Callable[[dict], Any], device: str) -> Any:
    import torch

    if isinstance(obj, list):
        return [decode(x, resolve, device) for x in obj]
    if isinstance(obj, dict):
        if "$in" in obj or "$node" in obj:
            return resolve(obj)
        if "$dtype" in obj:
            return getattr(torch, obj["$dtype"])
        if "$device" in obj:
            return torch.device(device)
        if "$layout" in obj:
            return getattr(torch, obj["$layout"])
        if "$memory_format" in obj:
            return getattr(torch, obj["$memory_format"])
        if "$float" in obj:
            return float(obj["$float"])
        return {k: decode(v, resolve, device) for k, v in obj.items()}
    return obj


def resolve_op(name: str):
    """'aten._softmax.default' -> torch.ops.aten._softmax.default."""
    import torch

    ns, op, overload = name.split(".", 2) if name.count(".") >= 2 else (*name.split(".", 1), "default")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def flatten_outputs(out: Any) -> list:
    """Tensor leaves of an op's output, in order (non-tensors kept so indices stay stable)."""
    if isinstance(out, (list, tuple)):
        flat: list = []
        for x in out:
            flat.extend(flatten_outputs(x))
        return flat
    return [out]


class _Ref:
    __slots__ = ("ref",)

    def __init__(self, ref: dict) -> None:
        self.ref = ref


def _substituter(template: Any, lookup: Callable[[dict], Any]) -> Callable[[], Any]:
    """A function that rebuilds ``template`` with every _Ref replaced by ``lookup(ref)``.

    Parts without references are built once, so a bound program costs little more per call than
    the aten calls themselves.
    """
    if isinstance(template, _Ref):
        ref = template.ref
        return lambda: lookup(ref)
    if isinstance(template, list) and any(_has_ref(x) for x in template):
        parts = [_substituter(x, lookup) for x in template]
        return lambda: [f() for f in parts]
    if isinstance(template, dict) and any(_has_ref(x) for x in template.values()):
        items = [(k, _substituter(v, lookup)) for k, v in template.items()]
        return lambda: {k: f() for k, f in items}
    return lambda: template


def _has_ref(x: Any) -> bool:
    if isinstance(x, _Ref):
        return True
    if isinstance(x, list):
        return any(_has_ref(y) for y in x)
    if isinstance(x, dict):
        return any(_has_ref(y) for y in x.values())
    return False


def refs(obj: Any, key: str) -> set[int]:
    """The indices that the references ``key`` (``"$node"`` or ``"$in"``) in an encoded
    program's arguments ``obj`` name."""
    if isinstance(obj, dict):
        found = {obj[key]} if key in obj else set()
        for v in obj.values():
            found |= refs(v, key)
        return found
    if isinstance(obj, list):
        return set().union(*(refs(v, key) for v in obj))
    return set()


def bind_program(program: dict, inputs: list, device: str | None = None) -> Callable[[], list]:
    """Prepare a program to run repeatedly on fixed input tensors; returns a no-argument callable."""
    if device is None:
        device = inputs[0].device.type if inputs else "cpu"
    env: list[list] = []

    def lookup(ref: dict):
        if "$in" in ref:
            return inputs[ref["$in"]]
        return env[ref["$node"]][ref.get("out", 0)]

    steps = []
    for node in program["nodes"]:
        op = resolve_op(node["op"])
        args = _substituter(decode(node["args"], _Ref, device), lookup)
        kwargs = _substituter(decode(node.get("kwargs", {}), _Ref, device), lookup)
        steps.append((op, args, kwargs))
    outs = [_substituter(_Ref(r), lookup) for r in program["outputs"]]

    def run() -> list:
        env.clear()
        for op, args, kwargs in steps:
            env.append(flatten_outputs(op(*args(), **kwargs())))
        result = [f() for f in outs]
        env.clear()
        return result

    return run


def run_program(program: dict, inputs: list, device: str | None = None) -> list:
    """Execute a program on the given input tensors; returns its output tensors."""
    return bind_program(program, inputs, device)()


def _py(value: Any, names: Callable[[dict], str]) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_py(v, names) for v in value) + "]"
    if isinstance(value, dict):
        if "$in" in value or "$node" in value:
            return names(value)
        if "$dtype" in value:
            return f"torch.{value['$dtype']}"
        if "$device" in value:
            return "device"
        if "$layout" in value:
            return f"torch.{value['$layout']}"
        if "$memory_format" in value:
            return f"torch.{value['$memory_format']}"
        if "$float" in value:
            return f"float({value['$float']!r})"
        return "{" + ", ".join(f"{k!r}: {_py(v, names)}" for k, v in value.items()) + "}"
    return repr(value)


def program_source(program: dict, n_inputs: int, name: str = "reference") -> str:
    """The program as a plain Python function of its inputs (readable by people and LLMs, and
    traceable by torch.compile)."""

    def names(ref: dict) -> str:
        if "$in" in ref:
            return f"in{ref['$in']}"
        return f"n{ref['$node']}[{ref.get('out', 0)}]"

    args = ", ".join(f"in{i}" for i in range(n_inputs))
    lines = [f"def {name}({args}{', ' if args else ''}device='cpu'):"]
    for i, node in enumerate(program["nodes"]):
        call_args = [_py(a, names) for a in node["args"]]
        call_args += [f"{k}={_py(v, names)}" for k, v in node.get("kwargs", {}).items()]
        ns, op, overload = node["op"].split(".", 2)
        lines.append(f"    n{i} = _flat(torch.ops.{ns}.{op}.{overload}({', '.join(call_args)}))")
    lines.append("    return [" + ", ".join(names(r) for r in program["outputs"]) + "]")
    return "\n".join(lines) + "\n"


def compile_source(program: dict, n_inputs: int) -> Callable:
    """A Python function (from ``program_source``) equivalent to ``run_program``, its source
    registered under a file name of its own (``linecache``): torch.compile of a function whose
    source file it cannot find (torch 2.11) traces it through one wrapper shared by every such
    function, whose 8 cached variants then run out, and from the 9th program on it runs eager's
    code unannounced (a bench timing torch.compile's kernels timed eager's)."""
    import hashlib
    import linecache

    import torch

    source = program_source(program, n_inputs)
    name = f"<forge-program-{hashlib.sha256(source.encode()).hexdigest()[:16]}>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    namespace: dict = {"torch": torch, "_flat": flatten_outputs}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace["reference"]


NO_GRAPH = ("torch.compile compiled no graph for it: Dynamo ran the reference's own code (its "
            "recompile limit reached, or the function skipped)")


def first_compiled_call(compiled: Callable, *args: Any, **kwargs: Any) -> str | None:
    """Call a fresh ``torch.compile`` of a reference program once, and say why not where Dynamo
    compiled no graph for the call: past its recompile limit it runs the function's own code with a
    warning alone, and a baseline timed so would be eager's under torch.compile's name."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    compiled(*args, **kwargs)
    return None if counters["stats"]["unique_graphs"] > before else NO_GRAPH


def tensor_leaves(obj: Any) -> list[Any]:
    """The tensors in a nest of lists, tuples and dicts, in order (a module's arguments or outputs)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensor_leaves(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensor_leaves(x)]
    return []


def run_program_float64(program: dict, inputs: list, device: str | None = None, rounding: str = "ops") -> list:
    """The program with each op computed in float64 and its result rounded once to the dtype
    eager gives it: the program's own roundings at op boundaries stay (a cast to fp16 is part of
    what it computes), the error inside one op's kernel goes. The evaluator's arbiter where a
    candidate and eager disagree. An op that mutates its arguments or returns a view of one keeps
    eager's result (computed on the widened values flowing in: a view stays a view of them, and an
    in-place op writes through it). Raises ``NoFloat64Result`` where an op has no float64 kernel on
    the device, or where its float64 result is finite where eager's is not or the reverse (an op
    whose result depends on the dtype, as ``nan_to_num``'s default replacement of inf does).

    ``rounding="casts"``: only the model's own casts (``_to_copy`` and ``copy_`` to another dtype)
    round inside; every other op's result stays in float64, and the outputs are rounded to their
    dtypes at the end. The truth of a kernel that computes a chain in fp32 and rounds its outputs
    once (the generated families' ``math`` modes, torch.compile): where eager's rounding of each
    product is what cancels (a rotary's ``q * cos + rotate_half(q) * sin``), eager is the one off."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    def wide(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
            return v.double()
        if isinstance(v, torch.dtype) and v.is_floating_point:
            return torch.float64
        return v

    def rounded(plain: Any, exact: Any, func: Any) -> Any:
        """``exact`` rounded to ``plain``'s dtypes; NoFloat64Result where one is finite and the
        other is not (an op whose result depends on the dtype)."""
        if isinstance(plain, torch.Tensor) and plain.is_floating_point() and isinstance(exact, torch.Tensor) \
                and exact.shape == plain.shape:
            out = exact.to(plain.dtype)
            if not torch.equal(torch.isfinite(plain), torch.isfinite(out)):
                raise NoFloat64Result(f"{func}: its float64 result is finite where eager's is not, or the reverse")
            return out
        if isinstance(plain, (list, tuple)) and isinstance(exact, (list, tuple)) and len(plain) == len(exact):
            return type(plain)(rounded(p, x, func) for p, x in zip(plain, exact))
        return plain

    class Widen(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            plain = func(*args, **kwargs)
            schema = func._schema
            if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
                return plain  # in place, or a view: it must stay one
            if _dtype_dependent(func, args, kwargs):
                raise NoFloat64Result(f"{func}: what it computes depends on the dtype")
            try:
                exact = func(*tree_map(wide, args), **tree_map(wide, kwargs))
            except Exception as exc:  # noqa: BLE001 - no float64 kernel for this op here
                raise NoFloat64Result(f"{func}: {type(exc).__name__}") from None
            if rounding == "casts" and schema.name.split("::")[-1] not in MODEL_CASTS:
                return exact
            return rounded(plain, exact, func)

    copies = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    with Widen():
        outs = run_program(program, copies, device)
    if rounding != "casts":
        return outs
    dtypes = _output_dtypes(program, inputs)
    return [o.to(dtypes[k]) if isinstance(o, torch.Tensor) and dtypes[k] is not None and o.dtype != dtypes[k] else o
            for k, o in enumerate(outs)]


MODEL_CASTS = ("_to_copy",)
"""The op by which a model casts at the dispatch level (``.to``, ``.float()``, ``type_as`` all
arrive as it; ``rounding="casts"`` keeps its rounding, and ``copy_`` into a tensor of another
dtype rounds as an in-place op)."""


def _output_dtypes(program: dict, inputs: list) -> list:
    """Each output's dtype in eager (torch.dtype), from the program's metadata; None where unknown."""
    import torch

    out = []
    for ref in program.get("outputs", []):
        dt = None
        if isinstance(ref, dict) and "$node" in ref:
            meta = program["nodes"][ref["$node"]].get("out") or []
            j = ref.get("out", 0)
            if j < len(meta) and meta[j] is not None:
                dt = getattr(torch, meta[j][1], None)
        elif isinstance(ref, dict) and "$in" in ref and isinstance(inputs[ref["$in"]], torch.Tensor):
            dt = inputs[ref["$in"]].dtype
        out.append(dt)
    return out


DTYPE_DEPENDENT_OPS = ("nan_to_num",)
"""Ops whose result depends on the dtype beyond rounding (nan_to_num replaces inf by the dtype's
largest value)."""


def _dtype_dependent(func: Any, args: Any, kwargs: dict) -> bool:
    """Would the op compute something else in float64 than in its eager dtype? Named ops, and an
    epsilon left to its default (``eps=None``: rms_norm then takes the dtype's machine epsilon,
    1.2e-7 for fp32, bf16 and fp16 alike, 2.2e-16 for float64)."""
    schema = func._schema
    if schema.name.split("::")[-1].lstrip("_") in DTYPE_DEPENDENT_OPS:
        return True
    for k, arg in enumerate(schema.arguments):
        if "eps" in arg.name:
            value = args[k] if k < len(args) else kwargs.get(arg.name, arg.default_value if arg.has_default_value() else None)
            if value is None:
                return True
    return False


class NoFloat64Result(Exception):
    """The program has no float64 result to arbitrate with (``run_program_float64``)."""
