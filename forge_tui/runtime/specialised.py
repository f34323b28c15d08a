"""A served call specialised to one way of calling a module: every check in one function."""

from __future__ import annotations

import time
from typing import Any, Callable

from .direct import CONTEXT_PROBES, context_probes
from .guard import FELL_BACK, KERNEL_ERRORS, NOT_SERVED, Guard


def plain_tensors(tensors: list[Any]) -> bool:
    """Every one a plain tensor or parameter (a subclass may override what its ops do)."""
    return (PLAIN_TENSOR_TYPES or plain_tensor_types()).issuperset(map(type, tensors))


PLAIN_TENSOR_TYPES: set[type] = set()


def plain_tensor_types() -> set[type]:
    import torch

    PLAIN_TENSOR_TYPES.update((torch.Tensor, torch.nn.Parameter))
    return PLAIN_TENSOR_TYPES


def specialised(guard: Guard, module: Any, device: str, n_args: int, owned: list[Any],
                 same: Callable[[dict[str, Any]], bool], arrange: Callable[..., list[Any]],
                 keep: int, lead: int | None = None) -> Callable[[Any, Any], Any] | None:
    """A served call of ``module`` specialised to one way of calling it, for a guard that is
    settled (``Guard.settled``): ``n_args`` tensors and no keyword, each a plain tensor, gradients
    off, no mode or transform active, the module's parameters and buffers the objects in ``owned``
    (none of them one of the call's tensors), its attributes unchanged (``same``), then the card's
    specs on the kernel's inputs (``arrange(*args, owned)``), then the launch, returning output
    ``keep``. While the guard times its dispatch, the call times itself (from its entry to the
    launch: the guard's cost, all checks included). Returns NOT_SERVED for the general path
    wherever a check fails (it checks again and counts the reason), FELL_BACK where the kernel
    failed (counted). None where the module has an empty parameter or buffer slot."""
    import operator

    import torch

    kernel = guard.kernel()
    if kernel is None:
        return None
    m = module
    pnames = tuple(n for n, p in m._parameters.items() if p is not None)
    bnames = tuple(n for n, b in m._buffers.items() if b is not None)
    n_p, n_b = len(m._parameters), len(m._buffers)
    if n_p != len(pnames) or n_b != len(bnames):
        return None  # a parameter or buffer slot set to None: the general path
    if tuple(map(id, owned)) != tuple(map(id, (*(m._parameters[n] for n in pnames), *(m._buffers[n] for n in bnames)))):
        return None
    get_owned: Callable[[Any], Any] = operator.itemgetter(*pnames, *bnames) if owned else dict
    single = len(owned) == 1
    expect = tuple(owned)
    owned_ids = frozenset(map(id, expect))
    status, board = guard.status, guard.board
    specs = guard._specs
    on_cuda = device == "cuda"
    plain = PLAIN_TENSOR_TYPES or plain_tensor_types()
    autocast, tf_modes, transforms, fwd_ad = CONTEXT_PROBES or context_probes()
    grad_on = torch.is_grad_enabled
    is_ = operator.is_

    def general(inputs: list[Any], t0: int = 0) -> Any:  # a kernel ``bind`` does not specialise
        t1 = time.perf_counter_ns() if t0 else 0
        out = kernel(inputs, bool(t0), keep)[keep]
        if t0:
            kernel.last_host_ns += t1 - t0
        return out

    bound = kernel.bind(keep) or general
    timing, clock = guard.timing, time.perf_counter_ns

    lead_shape = specs[lead][1] if lead is not None and n_args == 1 else None
    """The card's shape for the input the call's one tensor is (``lead``: its index among the
    kernel's inputs; a contiguous copy of it keeps its shape): compared first, so that a call at
    other shapes (a generation step) is refused at once."""

    def fast(args: Any, kwargs: Any) -> Any:
        if kwargs or len(args) != n_args or not status.active or guard.eager_pending:
            return NOT_SERVED
        t0 = clock() if timing() else 0
        if n_args == 1:
            x = args[0]
            if type(x) not in plain or id(x) in owned_ids or (lead_shape is not None and x.shape != lead_shape):
                return NOT_SERVED
        else:
            for a in args:
                if type(a) not in plain or id(a) in owned_ids:
                    return NOT_SERVED
            if len(set(map(id, args))) != n_args:
                return NOT_SERVED
        if grad_on() or autocast(device) or tf_modes() or transforms() is not None or fwd_ad._current_level >= 0:
            return NOT_SERVED
        if owned:
            ps, bs = m._parameters, m._buffers
            if len(ps) != n_p or len(bs) != n_b:
                return NOT_SERVED
            try:
                got = get_owned(ps if n_b == 0 else {**ps, **bs})
            except KeyError:
                return NOT_SERVED
            if single:
                if got is not expect[0]:
                    return NOT_SERVED
            elif not all(map(is_, got, expect)):
                return NOT_SERVED
        if not same(m.__dict__):
            return NOT_SERVED
        inputs = arrange(*args, expect)
        for t, (dtype, shape, stride) in zip(inputs, specs):
            if not (t.is_cuda if on_cuda else t.is_cpu) or t.dtype is not dtype or t.shape != shape or \
                    (t.stride() != stride and t.numel() > 1):
                return NOT_SERVED
        try:
            out = bound(inputs, t0)
        except KERNEL_ERRORS as exc:
            guard.kernel_failed(exc)
            return FELL_BACK
        if t0:  # the guard's first calls: what this path costs, all but the launch, and in all
            guard._account_dispatch(kernel.last_host_ns, clock() - t0)
        board.served(status)
        return out

    return fast
