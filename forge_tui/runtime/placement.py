"""Where each scope of op and chain cards is served: compiled (``graph/``), or intercepted
(``intercept.py``), and what runs outside a compiled scope's graph."""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any, Callable

from .applied import Applied
from .chain import ChainGuard
from .forwards import called_children
from .graph.callkeys import call_key
from .graph.scope import GraphScope, VariantBook, compilable
from .guard import gated, verdict
from .install import Install
from .intercept import intercepting, interceptor_class, outside_scope
from .leaf import LeafSites, direct_leaf
from .manifest import Entry
from .opmatch import OpGuard
from .trial import Trial

if TYPE_CHECKING:
    import torch


GRAPH_BREAKS = 2
"""How many modules below a compiled scope forge may serve too (``_graph_scope_ok``): each call of
one is a graph break, and past a few of them a compiled scope costs the host as much as an
intercepted one, then more; with two (an attention's q and k norms) it still costs far less."""


IN_GRAPH = True
"""Module cards below a compiled scope run in its graph, their custom op a node of it
(``module_forward``; an op of this guard's own, so that two applied models never share one),
rather than outside it, a graph break each, which costs the host more than the kernel's call. A
fallback the trace decides is counted at every call of the graph (``trace.TraceSinks``). Such a
card's own in-place trial (``Trial``) sees only
its calls outside a compiled graph; in the graph the bench's switch-off judges it."""


def in_scope_graph(applied: Applied, module: "torch.nn.Module") -> bool:
    """Whether ``module``'s forward is one a compiled scope's graph traces (a module card's)."""
    return IN_GRAPH and id(module.__dict__.get("forward")) in applied.in_graph


def busy_modules(applied: Applied, ops: dict[str, tuple[Any, list[OpGuard | ChainGuard]]]) -> set[int]:
    """The scopes and the modules whose forwards forge replaced so far (folds, experts, merges,
    module cards whose forward the graph cannot trace), by id: each a graph break in a compiled
    scope above it."""
    return {id(m) for m, _ in ops.values()} | {id(m) for m in applied.forwards.modules() if not in_scope_graph(applied, m)}


def learns(path: str, module: "torch.nn.Module", guards: list[OpGuard | ChainGuard]) -> bool:
    """Whether the scope at ``path`` is a leaf module of torch.nn whose one op is served: called
    straight, once learned (``LeafSites``)."""
    return bool(path) and direct_leaf(module) and not any(isinstance(g, ChainGuard) for g in guards)


def compiles(path: str, module: "torch.nn.Module", guards: list[OpGuard | ChainGuard], busy: set[int]) -> bool:
    """Whether the scope at ``path`` is served compiled (``apply``'s loop over the scopes) with
    the modules in ``busy`` served by forge."""
    return not learns(path, module, guards) and _graph_scope_ok(module, guards, busy)


def merges_sparing_scopes(applied: Applied, model: "torch.nn.Module", merges: list[Entry],
                           ops: dict[str, tuple[Any, list[OpGuard | ChainGuard]]]) -> list[Entry]:
    """The merge cards to install: those whose linears leave every scope that compiles compiled.
    A merge's siblings are modules forge serves, each a graph break in a compiled scope above them
    (``GRAPH_BREAKS``); a card that would tip a scope over to the interceptor is skipped with why:
    what the interceptor costs the host at every op of the scope is far more than what merging a
    few linears saves."""
    from .merge import groups_of

    busy = busy_modules(applied, ops)
    kept = []
    for e in merges:
        members = set()
        for paths in groups_of(e):
            for p in paths:
                try:
                    members.add(id(model.get_submodule(p)))
                except AttributeError:
                    pass  # install says why
        tipped = [path for path, (module, guards) in ops.items()
                  if compiles(path, module, guards, busy) and not compiles(path, module, guards, busy | members)]
        if tipped:
            applied.skipped[e.card] = (f"its linears would keep the scope {tipped[0] or 'of the model'} from running "
                                       f"compiled: more than {GRAPH_BREAKS} modules below it served by forge")
            continue
        kept.append(e)
        busy |= members
    return kept


def _graph_scope_ok(module: "torch.nn.Module", guards: list[OpGuard | ChainGuard], busy: set[int]) -> bool:
    """Whether a scope can be served compiled (``graph/``): its forward is its class's own, its
    cards were captured from its own calls and each has one tensor output and no constant input,
    and at most ``GRAPH_BREAKS`` modules below it (topmost) are served by forge outside its graph
    (a scope, a fold, a merge; a module card's runs in the graph, ``IN_GRAPH``): each a graph
    break (``_outside_graph``)."""
    if "forward" in module.__dict__ or not compilable(module.forward):
        return False
    for g in guards:
        sig = g.guard.sig
        if "direct" not in sig.flags or any(s.role == "const" for s in sig.inputs) or len(sig.outputs) != 1:
            return False
        if isinstance(g, OpGuard) and not g.single:
            return False
    breaks = _topmost(module, busy)
    return len(breaks) <= GRAPH_BREAKS and not (breaks and _loops(module.forward))


_LOOP_OPS = frozenset({"FOR_ITER", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"})


def _loops(forward: Callable[..., Any]) -> bool:
    """Whether the code a scope would compile for ``forward`` (the function a decorator wraps,
    innermost, as ``GraphScope`` compiles it) loops, in its own code or a comprehension's. Dynamo
    cannot break a graph inside a loop: it skips the whole frame and compiles every frame the
    forward calls instead, each with the scope's backend. A Llama's or Gemma-3's text model, whose
    layers' attentions are scopes of their own (each a graph break) called in its loop over the
    layers, would pay a compile of every layer on its first call and then run as written, its
    cards switched off."""
    import dis

    f: Any = getattr(forward, "__func__", forward)
    while isinstance(getattr(f, "__wrapped__", None), types.FunctionType):
        f = f.__wrapped__
    code = getattr(f, "__code__", None)
    todo = [code] if isinstance(code, types.CodeType) else []
    while todo:
        c = todo.pop()
        if any(i.opname in _LOOP_OPS for i in dis.get_instructions(c)):
            return True
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def _topmost(root: "torch.nn.Module", ids: set[int]) -> list["torch.nn.Module"]:
    """The modules below ``root`` in ``ids`` that have no such module between them and ``root``."""
    out = []
    for child in root.children():
        if id(child) in ids:
            out.append(child)
        else:
            out.extend(_topmost(child, ids))
    return out


def _outside_graph(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` where Dynamo never traces it: called from a compiled scope's graph, it is a graph
    break, and runs as forge serves it (its leaf site, its interceptor, its module card). Traced
    instead, the scope's graph would hold its ops as eager's, and the interceptor's Python."""
    import torch

    return torch._dynamo.disable(forward, recursive=True)  # type: ignore[no-any-return]


def _graph_forward(scope: GraphScope, guards: list[OpGuard | ChainGuard], trial: Trial | None,
                   path: str, take_out: Callable[[Callable[..., Any]], bool] | None = None) -> Callable[..., Any]:
    """A compiled scope's forward: a call its book refuses by its lead as written at once
    (``GraphScope.refusing``); the original once every card of the scope is off; tried in place
    first with a ``trial``; switched to the original, with the reason in each card's status, if
    the forward cannot be compiled."""
    owned = list({id(g.guard): g.guard for g in guards}.values())
    original = scope.original

    def failed(why: str) -> None:
        for g in owned:
            if g.status.active:
                g.board.disable(g.status, f"its scope {path or 'the model'} runs uncompiled: {why}")

    scope.on_failed = failed

    def servable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # like a call whose compiled variant served a card (the first such call compiles it,
        # untried): a call at other shapes would time the forward as written on both sides
        return bool(scope.book.serving) and call_key(args, kwargs) in scope.book.serving

    # a call the scope's book refuses by its lead runs as written before the gate's checks
    # (``GraphScope.refusing``); taking the forward out takes out that outermost one
    outer: list[Callable[..., Any]] = []

    def take_out_outer(_: Callable[..., Any]) -> bool:
        return take_out is not None and take_out(outer[0])

    outer.append(scope.refusing(gated(scope, original, owned, trial, servable,
                                      take_out_outer if take_out is not None else None)))
    return outer[0]


def scope_trial(trials: dict[tuple[str, ...], Trial], guards: list[OpGuard | ChainGuard], path: str, trial_calls: int,
                 device: str) -> Trial | None:
    """The in-place trial of a scope's interception, one for every scope serving the same cards
    (the decoder's `add` in each of its layers): their calls pool into one verdict, so one noisy
    layer does not switch a card off in all of them."""
    if trial_calls <= 0:
        return None
    served = list({id(g.guard): g.guard for g in guards}.values())
    key = tuple(sorted(g.entry.card for g in served))
    if key not in trials:
        def decide(with_us: float, without_us: float, calls: int) -> None:
            verdict(served, with_us, without_us, calls, f"the forward of {path or 'the model'} (and the scopes "
                    "serving the same cards)", "its ops intercepted", scope=path or "the model")

        trials[key] = Trial(trial_calls, device, decide)
    return trials[key]


def place(inst: Install) -> None:
    """Serve the scopes of op and chain cards (``Install.scopes``), each compiled where it can be
    (``GraphScope``) or else intercepted (``intercept.py``), its learned leaf site called straight
    (``LeafSites``); then put each module below a compiled scope whose forward forge replaced
    outside the scope's graph, or, a module card's, in it (``IN_GRAPH``)."""
    applied, ops, device = inst.applied, inst.scopes, inst.device
    trial_calls, compiled_scopes = inst.trial_calls, inst.compiled_scopes
    if ops:
        Interceptor = interceptor_class()
        outside: list[tuple[Any, object]] = []
        outsiders: dict[int, list[tuple[Any, Callable[..., Any]]]] = {}
        """An intercepted scope's children that run outside its interception, with their forwards."""
        trials: dict[tuple[str, ...], Trial] = {}
        busy = busy_modules(applied, ops)
        books: dict[tuple[Any, ...], VariantBook] = {}
        for path, (module, guards) in ops.items():
            trial = scope_trial(trials, guards, path, trial_calls, device)
            learned = learns(path, module, guards)
            if compiled_scopes and compiles(path, module, guards, busy):
                # the scopes alike (a model's layers: one forward's code, the same cards) share
                # what their compiles found (``VariantBook``)
                like = (getattr(getattr(module.forward, "__func__", None), "__code__", module.forward),
                        tuple(sorted(g.guard.entry.card for g in guards)))
                book = books.get(like)
                if book is None:  # the profiled calls of the cards' ops, for every scope alike
                    book = books[like] = VariantBook((k for g in guards for k in g.guard.sig.scope_keys), module.forward)
                scope = GraphScope(module, module.forward, [g.guard for g in guards], device, book, applied.trace)
                applied.scopes[path or ""] = scope
                applied._replace_forward(module, _graph_forward(scope, guards, trial, path,
                                                                functools.partial(applied.take_out, module)))
                for g in guards:
                    g.guard.status.sites = [f"{site} (compiled)" if site.endswith(f"under {path or 'the model'}") else site
                                            for site in g.guard.status.sites]
                continue
            table: dict[Any, list[OpGuard]] = {}
            chains: dict[Any, list[ChainGuard]] = {}
            for g in guards:
                if isinstance(g, ChainGuard):
                    if not g.linear:
                        where = f"a chain under {path or 'the model'}"
                        g.guard.status.sites = [
                            f"{site}: not served there (its ops also read its inputs, which an intercepted scope "
                            f"cannot follow; a compiled scope serves it)" if site == where else site
                            for site in g.guard.status.sites]
                        continue
                    chains.setdefault(g.head, []).append(g)
                else:
                    table.setdefault(g.func, []).append(g)
                    # the interceptor (or, once learned, the leaf's own forward) can run eager's
                    # call in the kernel's place, timed, where the dispatch looks too costly
                    # (``Guard.time_eager``)
                    g.guard.eager_timable = True
            owner = object()
            leaf = LeafSites(module, device) if learned else None
            if leaf is not None:
                applied.leaves[path] = leaf
                for g in guards:
                    g.guard.warmup += LeafSites.LEARN_CALLS
            children = outsiders[id(owner)] = []

            def take_out(new: Callable[..., Any], module: Any = module, children: list[Any] = children) -> bool:
                # the scope's own forward, then its children's, which left its interception
                if not applied.take_out(module, new):
                    return False
                for child, fwd in children:
                    applied.take_out(child, fwd)
                return True

            applied._replace_forward(module, intercepting(module.forward, Interceptor, table, trial, owner, leaf,
                                                           chains or None, take_out))
            if all("direct" in g.guard.sig.flags for g in guards):
                # the cards were captured from this module's own calls: its children run unintercepted
                outside.extend((child, owner) for child in called_children(module))
        # after every scope's own wrapper, so that a child that is a scope too leaves its parent's
        # interception before it starts its own
        for child, owner in outside:
            fwd = outside_scope(child.forward, owner)
            applied._replace_forward(child, fwd)
            outsiders[id(owner)].append((child, fwd))
    # last: a module below a compiled scope whose forward forge replaced (a scope, a fold, a merge)
    # runs outside the scope's graph, as forge serves it; a module card's runs in it (IN_GRAPH)
    replaced = {id(m) for m in applied.forwards.modules()}
    wrapped: set[int] = set()
    for scope in applied.scopes.values():
        for m in _topmost(scope.module, replaced):
            if id(m) not in wrapped:
                wrapped.add(id(m))
                if in_scope_graph(applied, m):  # a module card: in the scope's graph (IN_GRAPH)
                    m.__dict__["forward"].in_graph()
                else:
                    applied._replace_forward(m, _outside_graph(m.forward))
    applied.traced = {id(m) for scope in applied.scopes.values() for m in scope.module.modules() if m is not scope.module}
