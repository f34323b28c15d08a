"""Module cards: the forward of each leaf module a card was profiled at, served through its guard.

As Hugging Face ``kernels`` does with ``kernelize(model, mode=...)``, module cards replace the
``forward`` of the leaf modules they were profiled at (only those instances). In a model compiled
by torch.compile the forward puts the card's custom op (``custom_op``) in the graph.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from ..program import encode, tensor_leaves
from .attrs import card_check, difference, traced_check
from .custom_op import custom_op
from .direct import plain_context
from .graph.callkeys import call_key
from .guard import FELL_BACK, MISS_MEMO, NOT_SERVED, Guard
from .mode import Mode
from .specialised import plain_tensors, specialised
from .trace import TraceSinks, comptime_hook, note_traced, register

if TYPE_CHECKING:
    import torch


ATTRS_WHY = "its attributes differ from the profile's"
"""A traced call's fallback for a module whose attributes differ from the card's (where it is not
traced, the reason names the attribute: ``attrs.difference``)."""


def _all_tensors(args: Any) -> bool:
    import torch

    return all(isinstance(a, torch.Tensor) for a in args)


def _call_arguments(args: Any, kwargs: Any) -> Any:
    counter = {"k": 0}

    def ref(t: Any) -> dict[str, int]:
        counter["k"] += 1
        return {"$t": counter["k"] - 1}

    try:
        return encode([list(args), dict(kwargs)], ref)
    except Exception:  # noqa: BLE001 - an argument with no JSON form: not the recorded call
        return ()


def module_inputs(module: "torch.nn.Module", args: Any, kwargs: Any, consts: list["torch.Tensor"]) -> list["torch.Tensor"]:
    """The card's inputs for one call, in the order the profiler recorded them: the call's tensors,
    then the module's own parameters and buffers (each tensor once), then the card's constants."""
    # each tensor once, compared by identity with ``is``: not id(), which torch.compile guards on
    # as the object's identity, recompiling the forward for every new input tensor
    out: list["torch.Tensor"] = []
    for t in (args if not kwargs and _all_tensors(args) else tensor_leaves((args, kwargs))):
        for u in out:
            if u is t:
                break
        else:
            out.append(t)
    # what named_parameters/named_buffers(recurse=False) yield, in their order, without their
    # generators (this runs on every served call)
    for group in (module._parameters, module._buffers):
        for p in group.values():
            if p is None:
                continue
            for u in out:
                if u is p:
                    break
            else:
                out.append(p)
    if consts:
        out.extend(consts)
    return out


def module_forward(module: "torch.nn.Module", original: Callable[..., Any], guard: Guard, mode: Mode,
                   call_args: Any, returns: str, card_attrs: dict[str, Any], own_op: bool = False,
                   take_out: Callable[[Callable[..., Any]], bool] | None = None,
                   sinks: TraceSinks | None = None) -> Callable[..., Any]:
    """The forward of a module card's module. In a model compiled by torch.compile
    (``Mode.TORCH_COMPILE``) it puts the card's custom op in the graph; op by op it serves the
    call through its guard, and where Dynamo traces it (a compiled scope above it: ``graph/``)
    it is the compiled forward, so that the scope's graph holds the card's op and does not break
    around the module (``placement.IN_GRAPH``). Once the card is off, its first call asks
    ``take_out`` to put the module's own forward back (``Applied.take_out``). ``sinks``: where the
    fallbacks that a trace of it decides go (``trace.py``; the ``apply``'s own).

    ``card_attrs``: the module's plain attributes as the profile recorded them (``attrs.py``).
    Every call compares the module's with them, whenever they changed (before ``apply``, before
    the first call, or since): op by op in one lookup (``attrs.card_check``); where Dynamo traces
    the forward, attribute by attribute (``attrs.traced_check``), so that Dynamo guards each one
    and the graph's custom op serves only calls of a module whose attributes are the card's."""
    in_graph: list[Any] = [None]
    """The torch.compile forward that Dynamo traces, once a compiled scope above the module asks
    for it (``forward.in_graph()``: its custom op is defined then, not for every module card)."""
    op = custom_op(guard, own=own_op) if mode == Mode.TORCH_COMPILE else None
    guard.eager_timable = op is None
    device = guard.device
    tensors_only: int | None = None
    """How many positional tensors the profiled call passed, when it passed nothing else."""
    if call_args is not None and len(call_args) == 2 and call_args[1] == {} and \
            call_args[0] == [{"$t": i} for i in range(len(call_args[0]))]:
        tensors_only = len(call_args[0])

    import torch
    from torch import Tensor

    is_compiling = torch.compiler.is_compiling
    attrs: list[Callable[[dict[str, Any]], bool]] = []
    """The check that the module's attributes are the card's (``attrs.card_check``: its plain ones
    equal to ``card_attrs``, the others the objects they were at the first call, made at that call
    once forge's own forward is in the module's __dict__)."""
    traced_same = traced_check(card_attrs)
    """The same comparison of the plain attributes, for Dynamo to trace (``op``'s path)."""
    fast: list[Any] = [None, False]
    """The call specialised to the profiled way of calling the module (``specialised``), and
    whether it was tried: built after the first call the kernel serves with the guard settled."""
    misses: dict[Any, str] = {}
    """Calls of tensors only whose tensors the card's specs refuse, by the tensors' specs
    (``graph.call_key``): the reason, counted again for a like call, which then runs the module's own
    forward at once (``MissMemo``)."""
    shaped: dict[Any, Any] = {}
    """Refused calls whose first tensor, a plain one, has a shape not the card's (refused whatever
    its strides and whatever the call's other tensors are), by that tensor's shape, dtype and
    device: the count of their fallbacks for the reason (``status.Tally``, kept here without a
    call), for a call of as many arguments as the profiled one whose first argument
    was the card's first input. Looked up before anything else, so that a generation step's call
    (a shape no kernel serves, five times a step in a Llama's norms, once in its rotary
    embedding, which takes the position ids by keyword) costs the host little more than the
    module's own forward."""
    leads = bool(call_args) and len(call_args) == 2 and bool(call_args[0]) and call_args[0][0] == {"$t": 0} \
        and isinstance(call_args[1], dict) and bool(guard.sig.inputs)
    """Whether the profiled call's first argument is a tensor, the card's first input."""
    lead_shape = tuple(guard.sig.inputs[0].shape) if leads else None
    n_call = len(call_args[0]) + len(call_args[1]) if leads else -1
    """The profiled call's arguments, positional and keyword: a call of as many is looked up."""
    board, status = guard.board, guard.status
    out_tried: list[bool] = []
    """Whether ``take_out`` was asked (once: it refuses for good what it refuses)."""
    consts = guard.consts
    traced_key = f"{guard.entry.card}@{id(guard)}"
    comptime = None
    registered = None
    """Keeps ``traced_key`` naming the guard and its sinks while this forward lives."""
    if op is not None:
        registered = register(traced_key, guard, sinks if sinks is not None else TraceSinks())
        comptime = comptime_hook()

    def fell_back(why: str) -> None:
        if op is not None and is_compiling():
            # the trace decides for all the graph's calls: noted at the trace (``note_traced``)
            key = traced_key  # noqa: F841 (read by note_traced)
            if comptime is not None and registered is not None:
                comptime(note_traced)
            return
        guard.board.fell_back(guard.status, why)

    def arrange(*a: Any) -> list[Any]:  # the call's tensors, then the module's own, then the card's
        return [*a[:-1], *a[-1], *consts]

    def forward(*args: Any, **kwargs: Any) -> Any:
        traced = in_graph[0]
        if traced is not None and is_compiling():  # a compiled scope's trace: its op in the graph
            return traced(*args, **kwargs)
        if not status.active:  # switched off: the original at once, nothing checked
            if take_out is not None and not out_tried:
                out_tried.append(True)
                take_out(forward)
            fell_back("disabled")
            return original(*args, **kwargs)
        if shaped and args and len(args) + len(kwargs) == n_call:
            x = args[0]
            if type(x) is Tensor:
                tally = shaped.get((x.shape, x.dtype, x.device))
                if tally is not None:
                    tally.n += 1
                    return original(*args, **kwargs)
        f = fast[0]
        if f is not None:
            out = f(args, kwargs)
            if out is FELL_BACK:
                return original(*args, **kwargs)
            if out is not NOT_SERVED:
                return out
        if misses and op is None and not kwargs:
            why = misses.get(call_key(args, {}))
            if why is not None:  # the card refuses these tensors, whatever else the call is
                fell_back(why)
                return original(*args, **kwargs)
        # an attribute the kernel has compiled in (an eps, a scale) or that changes what the
        # forward computes (training) differs from the profile's: the forward as written
        if op is None:
            if not attrs:
                attrs.append(card_check(module, card_attrs))
            if not attrs[0](module.__dict__):
                fell_back(difference(module.__dict__, card_attrs))
                return original(*args, **kwargs)
        elif not traced_same(module.__dict__):
            fell_back(ATTRS_WHY if is_compiling() else difference(module.__dict__, card_attrs))
            return original(*args, **kwargs)
        if torch.is_grad_enabled() and (any(t.requires_grad for t in tensor_leaves((args, kwargs)))
                                        or any(p is not None and p.requires_grad for p in module._parameters.values())):
            fell_back("gradients are on (kernels serve inference)")
            return original(*args, **kwargs)
        if tensors_only is not None:  # the profiled call passed tensors only: no encoding needed
            same = not kwargs and len(args) == tensors_only
            if same:
                for t in args:
                    if not isinstance(t, Tensor):
                        same = False
                        break
        else:
            recorded = call_args if call_args is not None else [[{"$t": i} for i in range(len(args))], {}]
            same = _call_arguments(args, kwargs) == recorded
        if not same:
            fell_back("non-tensor arguments differ from the profiled call")
            return original(*args, **kwargs)
        tensors = module_inputs(module, args, kwargs, guard.consts)
        if op is None and not (plain_context(device) and plain_tensors(tensors)):
            fell_back("a transform, mode or tensor subclass is active")
            return original(*args, **kwargs)
        trial = guard.trial
        if op is None and trial is not None and trial.pending() and guard.mismatch(tensors) is None:
            # only calls the kernel can serve are tried: another shape's would time the original
            # forward on both sides, the kernel's with its refusal's cost
            def with_kernel() -> Any:
                served = guard.serve(tensors)
                if served is None:
                    return original(*args, **kwargs)
                return served[0] if returns == "tensor" else tuple(served)

            return trial.run(with_kernel, lambda: original(*args, **kwargs))
        if op is not None:
            why = guard.mismatch(tensors)
            if why or not guard.status.active:
                fell_back(why or "disabled")
                return original(*args, **kwargs)
            outs = op(tensors)
        else:
            if guard.eager_pending:
                return guard.time_eager(lambda: original(*args, **kwargs))
            t0 = time.perf_counter_ns() if guard.timing() else 0
            why = guard.mismatch(tensors)
            if why is not None:
                x = args[0] if args else None
                if lead_shape is not None and type(x) is Tensor and tuple(x.shape) != lead_shape:
                    if len(shaped) < MISS_MEMO:  # refused whatever the call's other arguments are
                        shaped[(x.shape, x.dtype, x.device)] = board.tally([status], why)
                elif tensors_only is not None and guard.refuses(tensors[:tensors_only]) and len(misses) < MISS_MEMO:
                    misses[call_key(args, {})] = why
                fell_back(why)
                return original(*args, **kwargs)
            served = guard.serve(tensors, checked_at=t0)
            if served is None:
                return original(*args, **kwargs)
            outs = served
            if not fast[1] and tensors_only is not None and returns == "tensor" and attrs and guard.settled() \
                    and (trial is None or not trial.pending()):
                fast[1] = True
                fast[0] = specialised(guard, module, device, tensors_only,
                                       tensors[tensors_only:len(tensors) - len(consts)], attrs[0], arrange, 0, 0)
        return outs[0] if returns == "tensor" else tuple(outs)

    def enable_in_graph() -> None:
        if in_graph[0] is None and op is None:
            timable = guard.eager_timable
            in_graph[0] = module_forward(module, original, guard, Mode.TORCH_COMPILE, call_args, returns, card_attrs,
                                         own_op=True, sinks=sinks)
            guard.eager_timable = timable  # its own forward's setting, not the compiled one's

    forward.in_graph = enable_in_graph  # type: ignore[attr-defined]
    return forward
