"""Serving op and chain cards in a module's forward compiled to an aten graph, at eager's cost.

The interceptor (``apply._interceptor_class``) sees a scope's ops one by one through a Python
dispatch mode: every op of the scope pays a trip through Python, 13-16 µs an op on the H200
machine's host, which cost the bundled decoder more a forward than its attention chains saved.
Here the scope's forward is compiled once by torch.compile (Dynamo, then AOTAutograd's inference
graph: the same aten ops the profiler recorded), each card's ops are found in the aten graph and
replaced by one call of the card's guarded kernel, and a graph runs as eager code would, op by op
with no mode. The graph that runs is Dynamo's own, torch calls as the forward makes them, with the
calls that made the card's ops replaced (``rewrite_torch_level``): on the H200 machine's host the
decoder's attention call with its chain served cost 546 µs that way and 935 µs as the aten graph
(eager: 575; bench/lab/chain_scope.py). A site whose ops are not whole torch calls is left as the
forward computes it (``GraphScope.unmapped``); where those would save more, or the forward makes an
in-place call, the aten graph runs. A chain's intermediates are replaced only where nothing else in
the graph reads them (the graph knows every reader), so no value is deferred.

Dynamo's guards decide when the graph stands for the forward (the same code, module attributes,
shapes, dtypes, grad mode); where they fail it compiles again, and where it cannot (its cache limit,
code it cannot trace) it runs the forward as Python. Each scope compiles a copy of its forward's
code object, so successive ``apply`` calls never share (or exhaust) one cache; a model's alike
scopes (its layers: one forward's code, the same cards, nothing forge replaced below them) compile
one copy together, Dynamo taking each layer's parameters as the graph's inputs, so a compile
serves every layer (``VariantBook.shared``). A scope
compiles few variants (``GraphScope.MAX_VARIANTS``; the cards serve the shapes they were profiled
at, and a generation loop meets new ones at every step), and alike scopes share what their compiles
found (``VariantBook``): a call no variant that serves covers runs as written. A call
that needs gradients, or comes while the scope cannot be compiled, runs the original forward. A
kernel call that the guard refuses (or that fails) computes the card's own aten program instead,
eager's ops on the same inputs.
"""

from __future__ import annotations

import math
import operator
import re
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..program import encodes_as, resolve_op, run_program
from .direct import HOOKED, MISS, DirectCall, ModuleHooks, cache_entries, lead_place, param_rank
from .direct import plain_context as _plain_context

if TYPE_CHECKING:
    import torch


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


def _fits(val: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str) -> bool:
    """Whether ``val`` (a graph value's example tensor) has the spec's dtype, shape and strides."""
    import torch

    if not isinstance(val, torch.Tensor):
        return False
    dtype, shape, stride = spec
    try:
        if val.dtype is not dtype or tuple(int(s) for s in val.shape) != shape or val.device.type != device:
            return False
        return val.numel() <= 1 or tuple(int(s) for s in val.stride()) == stride
    except (TypeError, RuntimeError):  # a symbolic size: not the card's
        return False


def _matches_spec(node: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str) -> bool:
    return _fits(node.meta.get("val"), spec, device)


def _misfit(val: Any, spec: tuple[Any, tuple[int, ...], tuple[int, ...]], device: str) -> str:
    """Why ``val`` (a graph value's example tensor) is not the spec's, as the guard says it."""
    import torch

    from .apply import _spec_mismatch

    if not isinstance(val, torch.Tensor):
        return "not a tensor"
    try:
        return _spec_mismatch(val, spec, device) or "a layout the card does not have"
    except (TypeError, RuntimeError):  # a symbolic size
        return "a symbolic size"


def find(graph: Any, program: dict, specs: list[Any], device: str,
         misses: list[tuple[list[Any], str]] | None = None) -> list[tuple[list[Any], list[Any]]]:
    """Where ``program`` (a card's aten program with one tensor output, its last node's) is
    computed in ``graph``: (the graph values its inputs are, in order; its nodes), each node after
    the first read from an earlier one or from an input bound already. Its nodes but
    the last must be read by its own nodes alone (neither other nodes nor the graph's outputs), and
    its inputs must have the card's dtypes, shapes and strides; ``misses`` receives, for each site
    that is the card's program on inputs without them, its nodes and why not ("input 0: shape (8,
    256)")."""
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
        bad = next((k for k, (v, s) in enumerate(zip(inputs, specs)) if not _matches_spec(v, s, device)), None)
        if bad is not None:
            if misses is not None:
                misses.append((env.nodes, f"input {bad}: {_misfit(inputs[bad].meta.get('val'), specs[bad], device)}"))
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
        for inputs, nodes in find(graph, guard.sig.program, guard._specs, device):
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
        for inputs, nodes in find(agm.graph, guard.sig.program, guard._specs, device):
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


def compilable(original: Any) -> bool:
    """Whether a forward can be compiled as a scope: a bound method of a plain Python function, and
    Dynamo works in this process (it supports this Python, and ``TORCHDYNAMO_DISABLE`` is not set:
    torch.compile would then return the forward untouched, and the scope's cards never serve)."""
    if not (isinstance(original, types.MethodType) and isinstance(original.__func__, types.FunctionType)):
        return False
    try:
        import torch._dynamo as dynamo

        return bool(dynamo.is_dynamo_supported()) and not dynamo.config.disable
    except Exception:  # noqa: BLE001 - no Dynamo: the interceptor serves the scope
        return False


class Leads:
    """The leads (``call_lead``: the first tensor's shape and dtype) of a scope's calls: those its
    cards' ops were profiled in, those whose calls served a card, and those whose calls served none.
    A call whose lead is among the last alone (``unlike``) is one no card serves, as far as a look at
    its first tensor can tell: a decode step's, where the cards were profiled at a prompt's shapes."""

    def __init__(self, profiled: Iterable[str] = (), forward: Any = None) -> None:
        self.rank: dict[str, int] = param_rank(forward) if forward is not None else {}
        """The scope forward's parameters by their place (``direct.param_rank``): which keyword
        tensor leads a call passed by keywords alone."""
        self._order = sorted(self.rank, key=self.rank.__getitem__)
        leads = [_text_lead(t, self.rank) for t in frozenset(profiled)]
        self.profiled_leads: frozenset[Any] = frozenset(lead for lead in leads if lead is not None)
        self.lead_rule = bool(leads) and _UNREAD not in leads
        """Whether ``unlike`` may answer yes: only where the profiled calls are recorded and read
        back (a workspace profiled before they were has none: a warm-up call with the profiled
        call's lead and another mask could otherwise keep the profiled call from being served)."""
        self.serving_leads: set[Any] = set()
        self.empty_leads: set[Any] = set()

    def unlike(self, lead: Any) -> bool:
        """Whether a call with this lead is one no card serves, as far as the leads can tell
        without its key: a call with the lead served nothing, none with it served, nor was one
        profiled with it. The cards' ops, whose shapes follow from the call's tensors, were not
        found at this one's."""
        return self.lead_rule and lead in self.empty_leads and lead not in self.serving_leads and \
            lead not in self.profiled_leads

    def lead(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``call_lead`` of a call of the scope's forward: for a call by keywords, the first of the
        forward's parameters it passes a tensor for, looked up in their order (a decode step's
        call passes its first parameter's tensor: one lookup, not a sort of its keywords)."""
        if not args:
            import torch

            for name in self._order:
                t = kwargs.get(name)
                if isinstance(t, torch.Tensor):
                    return tuple(t.shape), t.dtype
        return call_lead(args, kwargs, self.rank)

    def note(self, lead: Any, served: bool) -> None:
        """A call with this lead served a card, or none."""
        if lead is not None:
            (self.serving_leads if served else self.empty_leads).add(lead)


class VariantBook(Leads):
    """What the compiles of alike scopes (one forward's code, the same cards: a model's layers)
    found, by the key of the call that compiled each variant (``call_key``): the calls whose
    variant served a card's site, and those whose variant served none. A call with a key known to
    serve nothing compiles in no scope of the book; one with an unknown key compiles while the book
    has spent fewer than ``EMPTY_BUDGET`` compiles on variants that served nothing. A generation
    loop's steps (one shape a step in every layer, none of them profiled) so cost the model that
    many compiles, not one a step in each layer."""

    EMPTY_BUDGET = 3
    LOOKS = 64
    """Distinct calls the book looks up among ``profiled`` at most; then it stops looking (a
    generation loop whose profiled call never comes would pay for the lookup at every step)."""

    def __init__(self, profiled: Iterable[str] = (), forward: Any = None) -> None:
        self.profiled: frozenset[str] = frozenset(profiled)
        """The calls the profile saw the cards' ops made in (``key_text``; the cards'
        ``scope_keys``): a call like one of them compiles a variant in each scope whatever the
        scope met before (a model first called at other shapes, as a warm-up would, spent its
        compiles on variants that served nothing, and its kernels never served the profiled
        shape). Empty for workspaces profiled before it was recorded, and once ``LOOKS`` calls
        were looked up."""
        super().__init__(self.profiled, forward)
        self._looked: dict[Any, str | None] = {}
        self.serving: set[Any] = set()
        self.empty: set[Any] = set()
        self.shared = True
        """Whether the book's scopes compile one copy of the forward's code together (``clone``):
        Dynamo takes a module's parameters as the graph's inputs, so one compile serves every
        alike layer (8 Llama attention layers on the development machine's CPU: one compile of
        0.17 s against eight of 1.06 s, ``bench/lab/shared_compile_probe.py``). Off once a scope
        compiled a variant for a call like one an alike scope had compiled (Dynamo guards
        something of its own module: a variant a layer in one cache would reach its limit)."""
        self.clone: Any = None
        self.backend: Any = None
        """The backend of the shared copy's compiles (``GraphScope._backend(shared=True)``)."""
        self.current: Any = None
        """The scope whose call Dynamo is running, for the shared backend."""
        self.source: Any = None
        """The function ``clone`` copies (the scopes' forward, the innermost a decorator wraps)."""
        self.variants = _Variants()
        self.sites: dict[str, int] = {}
        self.levels: list[str] = []
        self.unmapped: dict[str, str] = {}

    def profiled_text(self, key: Any) -> str | None:
        """``key``'s text where it is one of ``profiled``, else None."""
        looked = self._looked
        if key in looked:
            return looked[key]
        if len(looked) >= self.LOOKS:
            self.profiled = frozenset()
            return None
        text = key_text(key)
        looked[key] = text if text in self.profiled else None
        return looked[key]

    def spent(self) -> bool:
        """Whether the compiles on variants that served nothing are spent."""
        return len(self.empty) >= self.EMPTY_BUDGET

    def worth(self, key: Any) -> bool:
        """Whether a call with this key may compile a variant."""
        if key in self.serving:
            return True
        return key not in self.empty and len(self.empty) < self.EMPTY_BUDGET


class _Variants:
    """The variants Dynamo compiled in one copy of a forward's code (a scope's own, or a book's
    shared one), by their code objects in the order compiled, and those whose graphs serve a card."""

    def __init__(self) -> None:
        self.codes: list[Any] = []
        self.serving: list[Any] = []
        self.stopped: str | None = None

    def number(self, code: Any) -> int:
        """The variant's number, from 1 in the order compiled; 0 for a code not among them."""
        return next((i + 1 for i, c in enumerate(self.codes) if c is code), 0)

    def serves(self, code: Any) -> bool:
        return any(c is code for c in self.serving)


def _entry_codes(function: Any) -> list[Any] | None:
    """The code objects of the variants Dynamo compiled of ``function``'s code, or None where this
    torch cannot say."""
    entries = cache_entries(function)
    return None if entries is None else [e.code for e in entries]


def _plain_subtree(module: Any) -> bool:
    """Whether nothing below ``module`` has a forward of its instance's own (forge's: a module
    card's, a child scope's) and no module of it has a hook: Dynamo guards such things per module,
    so alike scopes sharing one compile would each compile a variant."""
    from .direct import _HOOKS

    for m in module.modules():
        if m is not module and "forward" in m.__dict__:
            return False
        if any(m.__dict__.get(h) for h in _HOOKS):
            return False
    return True


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call's key for ``VariantBook`` (and for a refusal ``apply`` remembers): each tensor's
    dtype, shape, strides and device type, inside tuples and lists too; plain values as they are;
    any other object by its type (a cache object whose contents grow at each step keys alike at
    every step)."""
    tensor = _TENSOR or _tensor_type()
    if not kwargs and all(type(a) is tensor for a in args):  # the common case (a refused call's)
        try:
            return tuple((a.dtype, a.shape, a.stride(), a.device.type) for a in args), ()
        except RuntimeError:  # a tensor without sizes (a nested one): the general form below
            pass
    return tuple([_key_of(a) for a in args]), tuple(sorted([(k, _key_of(v)) for k, v in kwargs.items()]))


_PLAIN_TYPES = frozenset({bool, int, float, str, type(None)})


def _key_of(v: Any) -> Any:
    """One argument's part of ``call_key`` (``_TENSOR`` set)."""
    t = type(v)
    if t in _PLAIN_TYPES:
        return v
    if t is _TENSOR or isinstance(v, _TENSOR):
        try:
            return (v.dtype, v.shape, v.stride(), v.device.type)
        except RuntimeError:  # no sizes or strides (a nested tensor): its kind instead
            return (v.dtype, v.layout, t, v.device.type)
    if t is tuple or t is list or isinstance(v, (tuple, list)):
        return (t, tuple([_key_of(x) for x in v]))
    if isinstance(v, (bool, int, float, str)):  # a subclass (an IntEnum's member)
        return v
    return t


def key_text(key: Any) -> str:
    """``call_key``'s key as text, the same in every process (dtypes and types by name): how a
    profile records the calls a card's ops were made in (``VariantBook.profiled``)."""

    def norm(v: Any) -> Any:
        if isinstance(v, tuple):  # torch.Size too
            return tuple(norm(x) for x in v)
        if isinstance(v, type):
            return f"{v.__module__}.{v.__qualname__}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"float {v}"  # inf and nan as text: the key reads back (``_text_lead``)
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return str(v)  # a dtype

    return repr(norm(key))


def call_lead(args: tuple[Any, ...], kwargs: dict[str, Any], rank: Any = None) -> Any:
    """A call's lead tensor (``direct.lead_place``, the forward's parameters ranked by ``rank``) by
    its shape and dtype; None where it passes no tensor."""
    place = lead_place(args, kwargs, rank)
    if place is None:
        return None
    i, name = place
    if i is not None:
        t = args[i]
    else:
        assert name is not None
        t = kwargs[name]
    return tuple(t.shape), t.dtype


_UNREAD = object()


def _text_lead(text: str, rank: Any = None) -> Any:
    """``call_lead`` of the call a ``key_text`` stands for (``rank`` as there): None where it passed
    no tensor, ``_UNREAD`` where the text does not read back."""
    import ast

    import torch

    def spec(v: Any) -> Any:
        if isinstance(v, tuple) and len(v) == 4 and isinstance(v[0], str) and v[0].startswith("torch.") \
                and isinstance(v[1], tuple):
            dtype = getattr(torch, v[0].removeprefix("torch."), None)
            return (v[1], dtype) if isinstance(dtype, torch.dtype) else None
        return None

    try:
        args, kwargs = ast.literal_eval(text)
        for a in args:
            if (lead := spec(a)) is not None:
                return lead
        last = len(rank or ())
        named = sorted(kwargs, key=lambda kv: ((rank or {}).get(kv[0], last), kv[0]))  # the forward's order, then by name
        for _, v in named:
            if (lead := spec(v)) is not None:
                return lead
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _UNREAD
    return None


_TENSOR: Any = None


def _tensor_type() -> Any:
    global _TENSOR
    import torch

    _TENSOR = torch.Tensor
    return _TENSOR


class GraphScope:
    """A module's forward, compiled with its cards' ops replaced (see the module docstring)."""

    def __init__(self, module: "torch.nn.Module", original: Any, guards: list[Any], device: str,
                 book: VariantBook | None = None) -> None:
        self.module = module
        self.book = book if book is not None else VariantBook()
        """Shared with the scopes alike (``VariantBook``)."""
        self.original = original
        self.guards = guards
        self._statuses = [g.status for g in guards]
        self.device = device
        self.sites: dict[str, int] = {}
        """Per card, the sites replaced in the graphs compiled so far."""
        self._failed: str | None = None
        self.on_failed: Callable[[str], None] | None = None
        """Called with the reason once the scope fails (``failed``): the cards' statuses say it."""
        self.torch_level = True
        """Rewrite Dynamo's torch-level graph where the cards' sites map to it
        (``rewrite_torch_level``); else, or with False, the aten graph."""
        self.levels: list[str] = []
        """Per graph compiled: the level it runs at ("torch" or "aten")."""
        self.unmapped: dict[str, str] = {}
        """Cards with sites left unserved in a torch-level graph, and why."""
        self._compiled: Any = None
        self._clone: Any = None
        self.direct: DirectCall | None = None
        """Dynamo's code for the call that compiled the scope, run without Dynamo while a call is
        like that one (``direct.DirectCall``), or None."""
        self.direct_why: str | None = None
        """Why the scope has no direct call, once its first compiled call has run."""
        self._direct_tried = False
        self.calls = 0
        """Calls of the scope while compiled ones may serve it (not those that need gradients)."""
        self._hooks: ModuleHooks | None = None
        """The module hooks as the compile found them (Dynamo does not guard on them)."""
        self.rehooks = 0
        """Compiles again because a module hook was added or removed since the last."""
        self._traced: list[tuple[Any, str]] = []
        """The module cards' fallbacks noted while Dynamo traces the scope's forward, for its
        backend to count at every call of the graph (``apply.TRACE_SINKS``)."""
        self._vs = _Variants()
        """The variants compiled in the code this scope compiles (``_Variants``): its own copy's,
        or its book's shared one's (``shared``)."""
        self.shared = False
        """Whether the scope compiles its book's shared copy of the code (``VariantBook.shared``),
        decided at its first compile."""
        self.uncovered = 0
        """Calls run as written because no compiled variant covered them once compiling stopped."""
        self._run_only: Any = None
        """The compiled variants run without compiling (``torch._dynamo.run``), made once."""
        self._not_covered: set[Any] = set()
        """Keys of calls no compiled variant covered (``_uncompiled``); forgotten at a new variant."""
        self.pending: set[str] = set(self.book.profiled)
        """The book's profiled calls (``VariantBook.profiled``) no call of this scope has gone
        through Dynamo with yet: each compiles, or reuses, a variant whatever the limits."""
        def call(*args: Any, **kwargs: Any) -> Any:  # a plain function, as the cell held
            return self._wrapped(args, kwargs)

        target, wrapper = _pass_through(original.__func__, call)
        self._target: Any = target
        self._wrapper: Any = wrapper
        """A forward that a decorator wrapped (``functools.wraps``; the ``kernels`` library wraps
        Hugging Face's layers so, setting a context variable around the call in a try/finally):
        the function it wraps is what compiles, with a copy of its own code object (else every
        instance of the class shares one Dynamo cache, up to its limit of variants), and the
        wrapper runs as written, calling it. Compiled whole, a graph break inside the wrapped
        function left the scope no direct call: every call went through Dynamo. Otherwise the
        forward itself compiles, and ``_wrapper`` is None."""
        if self._target is None:
            self._target = original.__func__

    @property
    def variants(self) -> int:
        """Variants of the forward Dynamo compiled in the scope's code (one per way of calling it:
        shapes, dtypes, arguments; ``dynamic=False``), its book's where shared."""
        return len(self._vs.codes)

    @property
    def serving(self) -> list[int]:
        """The variants (numbered from 1, in the order compiled) whose graphs serve a card's site."""
        return [i + 1 for i, c in enumerate(self._vs.codes) if self._vs.serves(c)]

    @property
    def stopped(self) -> str | None:
        """Why the scope compiles no further variant (``MAX_VARIANTS``, or one its cards did not
        serve), or None: a call no compiled variant covers then runs as written."""
        return self._vs.stopped

    @property
    def direct_variant(self) -> int:
        """The variant the direct call runs (0: none): the first, or a later one that serves
        where the first does not."""
        return self._vs.number(self.direct.fn.__code__) if self.direct is not None else 0

    def _direct_serves(self) -> bool:
        return self.direct is not None and self._vs.serves(self.direct.fn.__code__)

    def _backend(self, shared: bool = False) -> Any:
        """The backend Dynamo hands the scope's graphs to. ``shared``: the book's, for the scopes
        that compile its shared copy (Dynamo guards on the backend: one each would compile a
        variant a scope); it works for the scope whose call is being compiled (``book.current``)."""
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        book = self.book

        def backend(gm: Any, example_inputs: Any) -> Any:
            scope = book.current if shared and book.current is not None else self
            torch_level: list[bool] = []
            missed: list[tuple[Any, str]] = list(scope._traced)
            """The cards whose program this graph computes on inputs their guards refuse, and why:
            each call of the graph counts them as fallbacks, as the interceptor counts a refused op;
            first the module cards whose calls the trace sent to PyTorch (``apply._note_traced``)."""
            scope._traced.clear()

            def compile_graph(agm: Any, inputs: Any) -> Any:
                sites: set[Any] = set()
                whys: list[tuple[Any, list[Any], str]] = []
                for g in scope.guards:
                    if g.status.active:
                        found_here: list[tuple[list[Any], str]] = []
                        for _, nodes in find(agm.graph, g.sig.program, g._specs, scope.device, found_here):
                            sites.update(nodes)
                        whys.extend((g, nodes, why) for nodes, why in found_here)
                # a site that another card of the scope serves (the k projection's chain where the
                # q projection's card has the same ops) is that card's, no fallback of this one
                missed.extend((g, why) for g, nodes, why in whys if not sites.intersection(nodes))
                try:
                    found = rewrite_torch_level(gm, agm, scope.guards, scope.device, scope.unmapped) \
                        if scope.torch_level else None
                    torch_level.append(found is not None)
                    if found is None:
                        found = rewrite(agm, scope.guards, scope.device)
                        if not found and scope.torch_level:
                            # nothing of the cards here (a piece of the forward between graph
                            # breaks): Dynamo's graph as traced, one torch call a node, costs the
                            # host less than the aten graph, whose every op is a Python call
                            torch_level[-1] = True
                    for card, n in found.items():
                        scope.sites[card] = scope.sites.get(card, 0) + n
                except Exception as exc:  # noqa: BLE001 - the graph as traced is eager's forward still
                    scope.failed = f"rewriting its graph failed: {type(exc).__name__}: {exc}"
                return make_boxed_func(agm.forward)

            traced = aot_autograd(fw_compiler=compile_graph, inference_compiler=compile_graph)(gm, example_inputs)
            if torch_level and torch_level[-1] and scope.failed is None:
                scope.levels.append("torch")
                for g in scope.guards:  # said where a user reads the card's status
                    why = scope.unmapped.get(g.entry.card)
                    note = f"not served in a torch-level scope: {why}"
                    if why and note not in g.status.sites:
                        g.status.sites.append(note)
                return _counting_misses(gm.forward, missed)
            scope.levels.append("aten")
            return _counting_misses(traced, missed)

        return backend

    def compiled(self) -> Any:
        if self._compiled is None:
            import torch

            func = self._target
            book = self.book
            if book.shared and self.rehooks == 0 and (book.source is None or book.source is func) and \
                    _plain_subtree(self.module):
                # one copy for the alike scopes: a compile serves every layer (``VariantBook``)
                book.source = func
                self.shared = True
                self._vs, self.sites, self.levels, self.unmapped = book.variants, book.sites, book.levels, book.unmapped
            else:
                self.shared = False
            clone = book.clone if self.shared else None
            if clone is None:
                # a copy of the code object: Dynamo keeps its cache on the code object, and this
                # scope's graphs (with this apply's kernels) are its own, or its book's
                clone = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__,
                                           func.__defaults__, func.__closure__)
                clone.__kwdefaults__ = func.__kwdefaults__
                if self.shared:
                    book.clone = clone
            self._clone = clone
            self._hooks = ModuleHooks(self.module)
            if self.shared and book.backend is None:
                book.backend = self._backend(shared=True)
            backend = book.backend if self.shared else self._backend()
            self._compiled = torch.compile(types.MethodType(clone, self.module), backend=backend, dynamic=False)
        return self._compiled

    MAX_REHOOKS = 4
    """Compiles again for changed module hooks, at most; after that the forward runs as written."""
    MAX_VARIANTS = 3
    """Variants of the forward a scope compiles at most. Each new shape is a compile of its own
    (tens of milliseconds for the smallest forward on the development machine's CPU, seconds for
    a real attention layer), and the cards serve the shapes they were profiled at: a generation
    loop whose every step meets new shapes compiled a variant a step for every layer, to Dynamo's
    limit of 8, and nothing was served in them. A scope stops at this many, and at the first
    variant its cards do not serve once one they do serve exists."""

    def _hooks_changed(self) -> bool:
        """A module hook added or removed since the compile (Dynamo traced the hooks then and does
        not guard on them: the graph would leave a new one out, or run a removed one). Compiles
        again from the next call, a fresh copy of the forward; True where the scope has done so
        ``MAX_REHOOKS`` times already, and runs as written from now on."""
        if self._hooks is None or self._hooks.same():
            return False
        if self.rehooks >= self.MAX_REHOOKS:
            self.failed = f"its module hooks changed after {self.MAX_REHOOKS} compiles"
            return True
        self.rehooks += 1
        self._compiled = self._clone = self._hooks = self._run_only = None
        self._not_covered.clear()
        self.direct, self.direct_why, self._direct_tried = None, None, False
        # a copy of its own from now on (``compiled``: rehooked scopes do not share)
        self._vs, self.shared, self.sites, self.levels, self.unmapped = _Variants(), False, {}, [], {}
        return False

    @property
    def failed(self) -> str | None:
        """Why the scope runs as written from now on (its compile failed, Dynamo skipped its frame,
        its hooks kept changing), or None."""
        return self._failed

    @failed.setter
    def failed(self, why: str | None) -> None:
        self._failed = why
        if why is not None and self.on_failed is not None:
            self.on_failed(why)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        book = self.book
        if book.empty_leads and self._failed is None and not torch.is_grad_enabled() and \
                not torch.compiler.is_compiling() and book.unlike(book.lead(args, kwargs)):
            # like a call that compiled a variant serving nothing (a generation step): as written,
            # told by its lead before the other checks, the decorator's code and ``_run``'s frames
            # (26 µs a decode step's attention call more than eager's on the development machine's
            # CPU through all of them)
            self.calls += 1
            self._count_uncovered()
            return self.original(*args, **kwargs)
        if self._failed is not None or torch.is_grad_enabled() or \
                torch.compiler.is_compiling() or self._hooks_changed() or not _plain_context(self.device) or \
                (self.device == "cuda" and self._compiled is None and torch.cuda.is_current_stream_capturing()):
            # under a mode or a transform (a __torch_function__ mode, autocast, vmap) the forward
            # runs as written: its module cards' own forwards then leave it to PyTorch
            return self.original(*args, **kwargs)
        self.calls += 1
        if self._wrapper is not None:  # the decorator's code as written; it calls ``_wrapped``
            return self._wrapper(self.module, *args, **kwargs)
        return self._run(self.original, args, kwargs)

    def _wrapped(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What a decorated forward's wrapper calls in place of the function it wraps: the scope,
        for a call on its module; else the function, as the wrapper would have called it."""
        if not args or args[0] is not self.module or self.failed is not None:
            return self._target(*args, **kwargs)
        return self._run(types.MethodType(self._target, self.module), args[1:], kwargs)

    def _run(self, as_written: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The compiled forward (``_target``): Dynamo's code directly where its guards pass, else
        through Dynamo; ``as_written`` where Dynamo fails on it."""
        import torch

        direct = self.direct
        if direct is not None and (self._direct_serves() or not self._vs.codes):
            out = direct(args, kwargs)
            if out is HOOKED:
                return as_written(*args, **kwargs)
            if out is not MISS:
                return out
        book, key, profiled = self.book, None, None
        if self.pending and book.profiled:  # a profiled call this scope has not compiled for yet
            key = call_key(args, kwargs)
            profiled = book.profiled_text(key)
        if profiled is None:
            if self.stopped is not None or (not book.serving and book.spent()):
                # nothing this scope (or one alike) compiled serves, and it compiles no more: its
                # graphs would run eager's ops, so the forward as written costs no more
                return self._uncompiled(as_written, args, kwargs, key)
            # the key costs the host a few µs: worked out before the call only where the book can
            # refuse one (scopes without a direct call go through here at every call)
            if key is None and book.empty:
                key = call_key(args, kwargs)
            if key is not None and not book.worth(key):
                return self._uncompiled(as_written, args, kwargs, key)
        first = not self._direct_tried
        from .apply import TRACE_SINKS

        sites = sum(self.sites.values())
        TRACE_SINKS.append(self._traced)
        outer, self.book.current = self.book.current, self
        try:
            out = self.compiled()(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            # raised before the forward ran: Dynamo failed on it, or our backend did
            self.failed = f"torch.compile failed on it: {type(exc).__name__}: {str(exc)[:300]}"
            return as_written(*args, **kwargs)
        finally:
            self.book.current = outer
            TRACE_SINKS.pop()
            self._traced.clear()
        if profiled is not None:
            self.pending.discard(profiled)
        served = self._count_variant(sites, key, args, kwargs)
        if self.failed is not None:
            return out
        if first:
            self._direct_tried = True
            if not _compiled_variants(self._clone):
                # Dynamo skipped the forward's own frame (code it does not trace) and compiled the
                # frames it calls instead, each with this scope's backend: as written is cheaper
                self.failed = "Dynamo compiled none of its own code (it skipped the forward's frame)"
                return out
        if first or (served and not self._direct_serves()):
            # the first call's variant, or one that serves where the direct call's does not (a
            # first call at other shapes): of the variants compiled (a shared copy's are its
            # book's), the one this call ran. The scope checks the hooks itself, before the call
            # (``_hooks_changed``)
            self.direct, self.direct_why = DirectCall.build(self._clone, self.module, self.device, hooks=False,
                                                            call=(args, kwargs))
        return out

    UNCOVERED_WHY = "a call unlike those its scope compiled served variants for (new shapes): run as written"

    def _count_variant(self, sites_before: int, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """After a call through Dynamo: where it compiled a variant, what it served (in the
        ``book``, by the call's ``key``, worked out here if the caller did not), and whether the
        scope compiles more (``MAX_VARIANTS``). True where the call compiled a variant that serves."""
        vs = self._vs
        codes = _entry_codes(self._clone)
        new = [c for c in (codes or ()) if not any(c is k for k in vs.codes)]
        if not new:
            return False
        if key is None:
            key = call_key(args, kwargs)
        if self.shared and key in self.book.serving | self.book.empty:
            # an alike scope compiled a call like this one: Dynamo guards something of this
            # module's own, and a shared cache would hold a variant a layer
            self.book.shared = False
        earlier = bool(vs.serving)
        vs.codes.extend(new)
        self._not_covered.clear()  # the new variant may cover them
        n = len(vs.codes)
        served = sum(self.sites.values()) > sites_before
        lead = self.book.lead(args, kwargs)
        if served:
            vs.serving.extend(new)
            self.book.serving.add(key)
            self.book.serving_leads.add(lead)
        else:
            self.book.empty.add(key)
            self.book.empty_leads.add(lead)
            if earlier:
                vs.stopped = (f"variant {n} (a call unlike those compiled before) holds none of its cards' sites, "
                              "where an earlier one does")
        if vs.stopped is None and n >= self.MAX_VARIANTS:
            vs.stopped = f"it compiled {n} variants, its limit"
        return served

    def _uncompiled(self, as_written: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    key: Any = None) -> Any:
        """A call the direct call refused once the scope compiles no more variants: the other
        compiled variants where Dynamo's guards pass one (run only, no compile), else the forward
        as written, counted as a fallback of each card the scope serves. Variants that serve
        nothing are not worth Dynamo's guards: as written costs no more. A call that no variant
        covered (nothing of the scope's cards was served or counted in it) is remembered by its
        key, and a like call runs as written at once. A tiny Llama's one-token forward whose two
        attention scopes had stopped ran 1.39-1.43x eager's time on the development machine's
        CPU with a run-only wrapper made at each call, 1.09-1.10x with one made once and such
        calls remembered."""
        direct = self.direct.fn.__code__ if self.direct is not None else None
        if any(c is not direct for c in self._vs.serving):
            if key is None:
                key = call_key(args, kwargs)
            if key not in self._not_covered:
                if self._run_only is None:
                    import torch

                    self._run_only = torch._dynamo.run(types.MethodType(self._clone, self.module))
                before = self._counted()
                out = self._run_only(*args, **kwargs)
                if self._counted() != before:
                    return out
                if len(self._not_covered) < self.NOT_COVERED:
                    self._not_covered.add(key)
                self._count_uncovered()
                return out
        self._count_uncovered()
        return as_written(*args, **kwargs)

    NOT_COVERED = 32
    """Calls ``_uncompiled`` remembers as covered by no variant, at most."""

    def _counted(self) -> int:
        """The served calls and fallbacks counted so far for the scope's cards."""
        return sum(g.status.served + sum(g.status.fallbacks.values()) for g in self.guards)

    def _count_uncovered(self) -> None:
        self.uncovered += 1
        if self.guards:  # one board holds an apply's cards
            self.guards[0].board.fell_back_each(self._statuses, self.UNCOVERED_WHY)


def _compiled_variants(function: Any) -> int:
    """How many variants of ``function``'s code Dynamo compiled (1 where this torch cannot say)."""
    entries = cache_entries(function)
    return 1 if entries is None else len(entries)


def _pass_through(func: Any, call: Callable[..., Any]) -> tuple[Any, Any] | tuple[None, None]:
    """(the function a decorator's ``func`` wraps, ``func`` calling ``call`` in its place) where
    ``func`` is such a wrapper: ``functools.wraps`` named what it wraps (``__wrapped__``) and one
    of its closure's cells holds it; through every level (Hugging Face's Gemma-3 attention is the
    ``kernels`` library's wrapper of a ``deprecate_kwarg`` wrapper of the forward, which takes
    ``*args``, ``self`` among them). Else (None, None)."""
    levels: list[tuple[Any, int]] = []
    f = func
    while isinstance(f, types.FunctionType):
        inner = getattr(f, "__wrapped__", None)
        held = [k for k, c in enumerate(f.__closure__ or ()) if _cell_holds(c, inner)]
        if not isinstance(inner, types.FunctionType) or len(held) != 1:
            break
        levels.append((f, held[0]))
        f = inner
    if not levels:
        return None, None
    nxt: Any = call
    for w, k in reversed(levels):
        closure = tuple(types.CellType(nxt) if i == k else c for i, c in enumerate(w.__closure__))
        nxt = types.FunctionType(w.__code__, w.__globals__, w.__name__, w.__defaults__, closure)
        nxt.__kwdefaults__ = w.__kwdefaults__
    return f, nxt


def _cell_holds(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _counting_misses(fn: Any, missed: list[tuple[Any, str]]) -> Any:
    """``fn`` (a compiled graph), counting each of ``missed`` as a fallback on every call."""
    if not missed:
        return fn

    def counted(*args: Any, **kwargs: Any) -> Any:
        for g, why in missed:
            g.board.fell_back(g.status, why)
        return fn(*args, **kwargs)

    return counted


REDUCING_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "logsumexp", "norm",
    "linalg_vector_norm", "prod", "cumsum", "_softmax", "_log_softmax", "native_layer_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "avg_pool2d",
    "max_pool2d_with_indices", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
})
"""Ops that read a row, a group or a window to write one value: what torch.compile cannot fuse as
freely as a pointwise op. A card under torch.compile needs one (``compile_worthy``). A batch norm
reduces only in training (``_TRAINING_ARG``); in inference it is a per-channel affine map."""

_TRAINING_ARG = {"native_batch_norm": 5, "_native_batch_norm_legit": 5}
"""Where a batch norm's ``training`` flag is among its arguments."""


def compile_worthy(program: dict) -> str | None:
    """Why a card's program is not served inside a torch.compile'd graph, or None. Pointwise
    programs are not: inductor fuses them into their neighbours' kernels, and an opaque kernel in
    their place would stop that (on the H200, ResNet-50's inference batch norms as custom ops cost
    its compiled forward 0.77x, each kernel faster than torch.compile's alone: inductor had fused
    each batch norm with the ReLU or the residual sum after it)."""
    for node in program.get("nodes", []):
        parts = str(node.get("op", "")).split(".")
        name = parts[1] if len(parts) > 1 else parts[0]
        if name in REDUCING_OPS:
            at, args = _TRAINING_ARG.get(name), node.get("args") or []
            if at is None or len(args) <= at or args[at] is not False:
                return None
    return "pointwise: torch.compile fuses it into its neighbours, where an opaque kernel would stop that"


class CompileBackend:
    """A torch.compile backend that serves op and chain cards inside the compiled graphs of one
    ``apply`` (``Applied.backend``): each graph Dynamo hands it is traced to aten ops by
    AOTAutograd with no decomposition (the ops the profiler recorded), each card's ops are found
    (``find``) and replaced by the card's custom op, and the graph goes on to the inner backend
    (inductor by default), which decomposes and fuses what is left and keeps each kernel as one
    opaque node. A graph with no card in it goes to the inner backend as Dynamo traced it. Graphs
    that need gradients are not rewritten (kernels serve inference)."""

    def __init__(self, guards: list[Any], device: str, opaque: Callable[[Any], Any], inner: str = "inductor") -> None:
        self.guards = guards
        self.device = device
        self.opaque = opaque
        self.inner = inner
        self.sites: dict[str, int] = {}
        """Per card, the sites replaced in the graphs compiled so far."""
        self.failed: list[str] = []
        """Why graphs went to the inner backend unrewritten (a rewrite that raised)."""

    def _inner(self) -> Any:
        from torch._dynamo import lookup_backend

        return lookup_backend(self.inner)

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        import torch._guards
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        if not any(g.status.active for g in self.guards):
            return self._inner()(gm, example_inputs)
        found: dict[str, int] = {}

        def inference(agm: Any, inputs: Any) -> Any:
            try:
                found.update(rewrite(agm, self.guards, self.device, self.opaque))
            except Exception as exc:  # noqa: BLE001 - the graph as Dynamo traced it is still right
                self.failed.append(f"{type(exc).__name__}: {exc}")
                found.clear()
            if not found:
                return make_boxed_func(agm.forward)  # discarded: Dynamo's graph goes on instead
            from torch.fx.graph import CodeGen

            agm.graph.set_codegen(CodeGen())  # positional arguments, as Dynamo's graphs take them
            agm.recompile()
            with torch._guards.tracing(None):  # the inner backend traces this graph afresh
                compiled = self._inner()(agm, list(inputs))
            return make_boxed_func(compiled)  # a backend's result takes positional arguments

        def training(agm: Any, inputs: Any) -> Any:
            return make_boxed_func(agm.forward)

        traced = aot_autograd(fw_compiler=training, inference_compiler=inference)(gm, example_inputs)
        if not found:
            return self._inner()(gm, example_inputs)
        for card, n in found.items():
            self.sites[card] = self.sites.get(card, 0) + n
        return traced
