"""A card's aten program found in a traced graph, and replaced by one call of its guarded kernel.

The aten graph (AOTAutograd's inference graph: the ops the profiler recorded) is searched for
each card's program (``find``) and each site replaced (``rewrite``); where the sites map to
Dynamo's own torch-level graph, that graph is rewritten instead (``rewrite_torch_level``).
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable

from ...program import encodes_as, resolve_op, run_program
from ...ranges import fits
from ..specs import spec_mismatch


class _Env:
    """One attempt at matching a program: its inputs bound to graph values, its nodes to graph nodes."""

    __slots__ = ("inputs", "nodes")

    def __init__(self, inputs: dict[int, Any] | None = None, nodes: list[Any] | None = None) -> None:
        self.inputs: dict[int, Any] = dict(inputs or {})
        self.nodes: list[Any] = list(nodes or [])


def _bind(pat: Any, val: Any, env: _Env) -> bool:
    from torch.fx import Node

    if type(pat) is dict:
        if "$in" in pat:
            if not isinstance(val, Node) or val in env.nodes:
                return False
            k = pat["$in"]
            have = env.inputs.get(k)
            if have is None:
                if any(v is val for v in env.inputs.values()):
                    return False  # two of the card's inputs are one value here
                env.inputs[k] = val
                return True
            return have is val
        if "$node" in pat:
            i = pat["$node"]
            return pat.get("out", 0) == 0 and i < len(env.nodes) and env.nodes[i] is val
    if type(pat) is list:
        return isinstance(val, (list, tuple)) and len(val) == len(pat) and all(_bind(p, v, env) for p, v in zip(pat, val))
    return not isinstance(val, Node) and encodes_as(val, pat)


def _bind_node(node: Any, pat: dict, env: _Env) -> _Env | None:
    """``env`` extended by ``node`` as the program's next node, or None when it is not."""
    if node.op != "call_function" or node.target is not resolve_op(pat["op"]):
        return None
    args, kwargs = pat.get("args", []), pat.get("kwargs", {})
    if len(node.args) != len(args) or set(node.kwargs) != set(kwargs):
        return None
    trial = _Env(env.inputs, env.nodes)
    if not all(_bind(p, v, trial) for p, v in zip(args, node.args)):
        return None
    if not all(_bind(kwargs[k], node.kwargs[k], trial) for k in kwargs):
        return None
    trial.nodes.append(node)
    return trial


def _fits(val: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str,
          ranged: dict[int, tuple[int, int]] | None = None) -> bool:
    """Whether ``val`` (a graph value's example tensor) has the spec's dtype, shape and strides;
    for a range card's input (``ranged``: its ranged dimensions), its shape class
    (``ranges.fits``: fixed dimensions equal, ranged ones inside their range)."""
    import torch

    if not isinstance(val, torch.Tensor):
        return False
    if ranged:
        return _ranged_misfit(val, spec, device, ranged) is None
    dtype, shape, stride = spec
    try:
        if val.dtype is not dtype or tuple(int(s) for s in val.shape) != shape or val.device.type != device:
            return False
        return val.numel() <= 1 or tuple(int(s) for s in val.stride()) == stride
    except (TypeError, RuntimeError):  # a symbolic size: not the card's
        return False


def _misfit(val: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str,
            ranged: dict[int, tuple[int, int]] | None = None) -> str:
    """Why ``val`` (a graph value's example tensor) is not the spec's (or of its shape class, for
    a range card's input), as the guard says it."""
    import torch

    if not isinstance(val, torch.Tensor):
        return "not a tensor"
    if ranged:
        return _ranged_misfit(val, spec, device, ranged) or "a layout the card does not have"
    try:
        return spec_mismatch(val, spec, device) or "a layout the card does not have"
    except (TypeError, RuntimeError):  # a symbolic size
        return "a symbolic size"


class _Sizes:
    """A graph value's dtype, sizes and strides as plain numbers, as ``ranges.fits`` reads a tensor."""

    __slots__ = ("dtype", "shape", "strides")

    def __init__(self, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.dtype, self.shape, self.strides = dtype, shape, strides

    def stride(self) -> tuple[int, ...]:
        return self.strides

    def numel(self) -> int:
        return math.prod(self.shape)


def _ranged_misfit(val: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str,
                   ranged: dict[int, tuple[int, int]]) -> str | None:
    """``ranges.fits`` of a graph value against a range card's input, None where it fits."""
    try:
        sizes = _Sizes(val.dtype, tuple(int(n) for n in val.shape), tuple(int(n) for n in val.stride()))
    except (TypeError, RuntimeError):  # a symbolic size: not the card's
        return "a symbolic size"
    if val.device.type != device:
        return f"device {val.device.type}"
    return fits(sizes, *spec, ranged)


def find(graph: Any, program: dict, specs: list[Any], device: str,
         misses: list[tuple[list[Any], str]] | None = None,
         ranged: dict[int, dict[int, tuple[int, int]]] | None = None) -> list[tuple[list[Any], list[Any]]]:
    """Where ``program`` (a card's aten program with one tensor output, its last node's) is
    computed in ``graph``: (the graph values its inputs are, in order; its nodes), each node after
    the first read from an earlier one or from an input bound already. Its nodes but
    the last must be read by its own nodes alone (neither other nodes nor the graph's outputs), and
    its inputs must have the card's dtypes, shapes and strides, or, for a range card (``ranged``:
    the guard's ranged dimensions per input), its shape classes; ``misses`` receives, for each
    site that is the card's program on inputs without them, its nodes and why not ("input 0:
    shape (8, 256)")."""
    pats = program["nodes"]
    n_in = len(specs)
    found: list[tuple[list[Any], list[Any]]] = []
    used: set[Any] = set()
    for head in list(graph.nodes):
        if head in used:
            continue
        env = _bind_node(head, pats[0], _Env())
        if env is None:
            continue
        for pat in pats[1:]:
            nxt = None
            # the next node reads one the program computed or one of its inputs (rotate-half's
            # slices read the chain's input)
            for cand in {u: None for n in (*env.nodes, *env.inputs.values()) for u in n.users}:
                nxt = _bind_node(cand, pat, env)
                if nxt is not None:
                    break
            env = nxt
            if env is None:
                break
        if env is None or len(env.inputs) != n_in or any(n in used for n in env.nodes):
            continue
        inner = set(env.nodes)
        if any(u not in inner for n in env.nodes[:-1] for u in n.users):
            continue
        inputs = [env.inputs[k] for k in range(n_in)]
        ranges = ranged or {}
        bad = next((k for k, (v, s) in enumerate(zip(inputs, specs))
                    if not _fits(v.meta.get("val"), s, device, ranges.get(k))), None)
        if bad is not None:
            if misses is not None:
                why = _misfit(inputs[bad].meta.get("val"), specs[bad], device, ranges.get(bad))
                misses.append((env.nodes, f"input {bad}: {why}"))
            continue
        found.append((inputs, env.nodes))
        used |= inner
    return found


def _served_call(guard: Any, device: str) -> Callable[..., Any]:
    """The function the graph calls in place of the card's ops: the kernel through its guard, else
    the card's own program (eager's ops on the same inputs)."""
    program = guard.sig.program

    def call(*inputs: Any) -> Any:
        ins = list(inputs)
        outs = guard.serve(ins)
        if outs is None:
            outs = run_program(program, ins, device)
        return outs[0]

    call.__name__ = "forge_" + re.sub(r"\W", "_", guard.entry.card)
    return call


def rewrite(gm: Any, guards: list[Any], device: str, opaque: Callable[[Any], Any] | None = None) -> dict[str, int]:
    """Each guard's card replaced in the aten graph ``gm`` by a call of its kernel; how many sites
    each card got. ``opaque``: the card's custom op (``torch.library``, a list of tensors in and
    out) for a graph that a compiler lowers next; without it, a plain Python call."""
    graph = gm.graph
    sites: dict[str, int] = {}
    for guard in guards:
        if not guard.status.active:
            continue
        for inputs, nodes in find(graph, guard.sig.program, guard._specs, device, ranged=guard.ranged):
            last = nodes[-1]
            with graph.inserting_before(last):
                if opaque is None:
                    new = graph.call_function(_served_call(guard, device), tuple(inputs))
                else:
                    call = graph.call_function(opaque(guard), (list(inputs),))
                    if "val" in last.meta:
                        call.meta["val"] = [last.meta["val"]]
                    new = graph.call_function(operator.getitem, (call, 0))
            _put_in_place(graph, new, nodes)
            sites[guard.entry.card] = sites.get(guard.entry.card, 0) + 1
    return _recompiled(gm, sites)


def _put_in_place(graph: Any, new: Any, nodes: list[Any]) -> None:
    """``new`` takes the place of a card's ``nodes`` (in graph order, the last its output)."""
    last = nodes[-1]
    new.meta = dict(last.meta)
    last.replace_all_uses_with(new)
    for n in reversed(nodes):
        graph.erase_node(n)


def _recompiled(gm: Any, sites: dict[str, int]) -> dict[str, int]:
    if sites:
        gm.graph.lint()
        gm.recompile()
    return sites


_IN_PLACE = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
             "ilshift", "irshift", "imatmul", "setitem"}


def _source(node: Any, names: dict[str, Any]) -> Any:
    """The Dynamo graph's node that an aten node was traced from (``from_node``), or None."""
    for src in reversed(node.meta.get("from_node") or []):
        hit = names.get(str(getattr(src, "name", "")))
        if hit is not None:
            return hit
    return None


def _same_tensor(a: Any, b: Any) -> bool:
    """Whether Dynamo's example value ``a`` and AOTAutograd's ``b`` are the same kind of tensor."""
    import torch

    if not isinstance(b, torch.Tensor):
        return False
    try:
        spec = (b.dtype, tuple(int(n) for n in b.shape), tuple(int(n) for n in b.stride()))
    except (TypeError, RuntimeError):
        return False
    return _fits(a, spec, b.device.type)


def _in_place(node: Any) -> bool:
    name = getattr(node.target, "__name__", node.target if isinstance(node.target, str) else "")
    return str(name).endswith("_") or str(name) in _IN_PLACE


def _output_of(call: Any, v: Any) -> Any:
    """Where aten node ``v`` is output k of a torch ``call`` with several (``chunk``, ``split``,
    ``unbind``: AOTAutograd names that call as the source of each ``getitem`` it traced), the
    ``getitem`` of Dynamo's graph taking the same output; None otherwise."""
    if not (v.op == "call_function" and v.target is operator.getitem and len(v.args) == 2):
        return None
    k = v.args[1]
    return next((u for u in call.users if u.op == "call_function" and u.target is operator.getitem
                 and len(u.args) == 2 and u.args[0] is call and u.args[1] == k), None)


def _torch_site(guard: Any, inputs: list[Any], nodes: list[Any], names: dict[str, Any], made: dict[Any, list[Any]],
                ph: dict[Any, Any]) -> tuple[Any, list[Any], set[Any], Any] | str:
    """One site of a card found in the aten graph, as Dynamo's graph has it: (the guard, the
    card's inputs as its nodes, the nodes that compute the card, the last of them), or why not."""
    srcs = [_source(n, names) for n in nodes]
    if any(x is None for x in srcs):
        return "an op of the card has no torch call it came from"
    body, last = set(srcs), srcs[-1]
    inner = set(nodes)
    if any(a not in inner for x in body for a in made.get(x, [])) or made[last][-1] is not nodes[-1]:
        return "a torch call that makes the card's ops makes others too"
    if any(_in_place(x) or x.op not in ("call_function", "call_method") for x in body):
        return "the card's ops come from an in-place call or a module call"
    if any(u not in body for x in body if x is not last for u in x.users):
        return "an intermediate of the card is read elsewhere"
    args = []
    for v in inputs:
        if v.op == "placeholder":
            d = ph.get(v)
        else:
            d = _source(v, names)
            if d is not None and d not in body:
                d = _output_of(d, v) or (d if made[d][-1] is v else None)
            if d is None or d in body:
                return "an input of the card is not a whole value of a torch call"
        if d is None or not _same_tensor(d.meta.get("example_value"), v.meta.get("val")):
            return "an input of the card is not a whole value of a torch call"
        args.append(d)
    if not _same_tensor(last.meta.get("example_value"), nodes[-1].meta.get("val")):
        return "the card's output is not a whole value of a torch call"
    return guard, args, body, last


def rewrite_torch_level(gm: Any, agm: Any, guards: list[Any], device: str,
                        skipped: dict[str, str] | None = None) -> dict[str, int] | None:
    """Each guard's card replaced in Dynamo's own graph ``gm`` (torch-level calls, as the
    forward's code makes them), found through ``agm``, the aten graph AOTAutograd traced from it:
    each aten node names the ``gm`` node it came from. How many sites each card got. A site that
    does not map is left as the forward computes it, its reason in ``skipped``: a ``gm`` node that
    made ops of the card and others (a reshape that copies), a card input that is not a whole
    ``gm`` value, an intermediate read elsewhere (a shape query included). None, and ``gm``
    untouched, where no site maps, where the sites that do not map would save more device time a
    call than those that do (by their evaluations: the aten graph then serves them all), or where
    ``gm`` makes any in-place call (the aten graph is functionalised, so a card found there reads
    its inputs before any change). The graph then runs as eager code does, one
    torch call a node, and costs the host less than the aten graph, whose every op is a Python
    call of its own (a linear is four)."""
    names = {n.name: n for n in gm.graph.nodes}
    if any(n.op in ("call_function", "call_method") and _in_place(n) for n in gm.graph.nodes):
        return None  # the aten graph is functionalised; this one would read a changed input
    dyn_ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    aot_ph = [n for n in agm.graph.nodes if n.op == "placeholder"]
    if len(dyn_ph) != len(aot_ph):
        return None
    ph = dict(zip(aot_ph, dyn_ph))
    made: dict[Any, list[Any]] = {}
    """gm node -> the aten nodes traced from it, in order."""
    for n in agm.graph.nodes:
        if n.op == "call_function":
            src = _source(n, names)
            if src is not None:
                made.setdefault(src, []).append(n)
    plans: list[tuple[Any, list[Any], set[Any], Any]] = []
    unmapped: dict[str, str] = {}
    taken: set[Any] = set()
    gain = {True: 0.0, False: 0.0}
    """Device time the mapped and the unmapped sites save a call, by their evaluations."""
    for guard in guards:
        if not guard.status.active:
            continue
        for inputs, nodes in find(agm.graph, guard.sig.program, guard._specs, device, ranged=guard.ranged):
            if taken.intersection(nodes):
                continue  # an earlier card's site (the aten graph's rewrite takes the first too)
            taken.update(nodes)
            plan = _torch_site(guard, inputs, nodes, names, made, ph)
            gain[not isinstance(plan, str)] += max(guard.gain_us or 0.0, 0.0)
            if isinstance(plan, str):
                unmapped[guard.entry.card] = plan
            else:
                plans.append(plan)
    if not plans or gain[False] > gain[True]:
        return None  # the aten graph serves more
    if skipped is not None:
        skipped.update(unmapped)
    sites: dict[str, int] = {}
    graph = gm.graph
    replaced: dict[Any, Any] = {}
    """A card's last node -> the call that took its place (a later card may read its value)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    """The graph's nodes in order, as traced: the sites' bodies are disjoint and keep it."""
    for guard, args, body, last in plans:
        args = [replaced.get(a, a) for a in args]
        with graph.inserting_before(last):
            new = graph.call_function(_served_call(guard, device), tuple(args))
        _put_in_place(graph, new, sorted(body, key=order.__getitem__))
        replaced[last] = new
        sites[guard.entry.card] = sites.get(guard.entry.card, 0) + 1
    return _recompiled(gm, sites)
