"""Leaf modules whose forward is one served op: called straight, once learned, without the interceptor."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from .attrs import attrs_check, module_attrs
from .direct import plain_context
from .forwards import called_children
from .graph.callkeys import call_key
from .guard import FELL_BACK, MISS_MEMO, NOT_SERVED, TIME_EAGER, Guard
from .specialised import PLAIN_TENSOR_TYPES, plain_tensor_types, plain_tensors, specialised

if TYPE_CHECKING:
    from .opmatch import OpGuard


DIRECT_ATTR = "forge_direct"
"""A module class that sets this attribute true declares that its forward reads nothing but its
call's tensors and its own attributes (no config object changed in place, no global), as the
``torch.nn`` modules' own forwards do: its op card may then be learned (``LeafSites``)."""


def direct_leaf(module: Any) -> bool:
    """A leaf module whose forward is ``torch.nn``'s own (nn.LayerNorm, nn.GroupNorm, nn.SiLU...),
    or whose class opts in with ``DIRECT_ATTR``; not one whose forward something replaced (a
    module card's)."""
    if called_children(module) or "forward" in module.__dict__:
        return False
    fwd = getattr(type(module), "forward", None)
    return bool(getattr(type(module), DIRECT_ATTR, False)) or \
        (getattr(fwd, "__module__", "") or "").startswith("torch.nn.modules.")


def _aliases(tensors: list[Any]) -> tuple[int, ...]:
    """For each tensor, the first position of the same tensor: which arguments are one tensor."""
    if len(set(map(id, tensors))) == len(tensors):
        return tuple(range(len(tensors)))
    return tuple(next(i for i, u in enumerate(tensors) if u is t) for t in tensors)


class MissMemo:
    """The calls of a leaf module (``LeafSites``) that no card served under the interceptor, with
    the refusals each counted: a like call counts them again and runs the module's own forward,
    not intercepted (``MISS_MEMO``). Like means the same tensors' specs, the module's parameters
    and buffers the same objects with the same specs, its attributes unchanged since
    (``attrs_check``), gradients in the same mode, and no mode or transform active: the leaf's
    forward (``direct_leaf``: it reads nothing else) then makes the same ops on tensors of the
    same specs, which the cards refuse as before."""

    def __init__(self, module: Any, device: str) -> None:
        self.module = module
        self.device = device
        self.known: dict[Any, tuple[Callable[[dict[str, Any]], bool], tuple[tuple[Guard, str], ...]]] = {}

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's key, or None where it is not remembered (keyword arguments, another
        argument than a tensor, a mode or transform active)."""
        import torch

        if kwargs or not plain_context(self.device):
            return None
        for a in args:
            if type(a) not in (PLAIN_TENSOR_TYPES or plain_tensor_types()):
                return None
        m = self.module
        owned = tuple((id(t), t.dtype, t.shape, t.stride(), t.device)
                      for group in (m._parameters, m._buffers) for t in group.values() if t is not None)
        return call_key(args, {}), owned, torch.is_grad_enabled()

    def get(self, key: Any) -> tuple[tuple[Guard, str], ...] | None:
        got = self.known.get(key)
        if got is None or not got[0](self.module.__dict__):
            return None
        return got[1]

    def put(self, key: Any, missed: list[tuple[Guard, str]] | None) -> None:
        if len(self.known) < MISS_MEMO:
            self.known[key] = (attrs_check(module_attrs(self.module), self.module.__dict__), tuple(missed or ()))


class LeafSites:
    """What an op card's scope learns when it is a leaf module whose forward is that one op: the
    module's call then goes straight to the card's guard, without entering the interceptor (its
    entry and the op's trip through Python cost a call more host time than the kernel's own
    dispatch; nn.GroupNorm and nn.LayerNorm are such modules).

    Learned from the calls themselves, under the interceptor: a site is a forward that passed
    tensors only, dispatched exactly one op, which a card served, every one of whose tensors was
    one of the call's or the module's own (parameters, buffers), and returned one of its outputs.
    The op may follow contiguous copies of the call's tensors that it reads (``_copied``:
    nn.GroupNorm copies a channels-last input before its op); a learned call makes them the same
    way, ``Tensor.contiguous()``, and serves the op on them.
    The same site (attributes included: ``_attrs``) seen on ``LEARN_CALLS`` calls in a row is
    learned. A learned call is served only when the module's attributes are still those it was
    learned with (plain values equal, the others the same objects), the same arguments are one
    tensor as then, the tensors are plain, gradients are off, no transform or mode is active
    (``plain_context``) and the guard matches the tensors; anything else goes through the
    interceptor, as before. Only modules whose forward reads nothing else are learned
    (``direct_leaf``): ``torch.nn``'s own, or a class that says so with ``DIRECT_ATTR``. After ``GIVE_UP`` calls that teach nothing, the scope
    stops learning."""

    LEARN_CALLS = 2
    GIVE_UP = 8

    def __init__(self, module: Any, device: str) -> None:
        self.module = module
        self.device = device
        self.sites: list[tuple[OpGuard, tuple[int, ...], int, int, tuple[tuple[str, Any, bool], ...],
                               tuple[int, ...], tuple[int, ...]]] = []
        """(the card, the op's tensors as indices into the call's and then into their copies, the
        output returned (-1: the op's only one), the call's tensor count, the module's attributes
        (``_attrs``), which of the call's tensors are the same tensor (``_aliases``), the call's
        tensors copied contiguous before the op (``_copied``))."""
        self._candidate: Any = None
        self._seen = 0
        self._useless = 0
        self._same: list[Callable[[dict[str, Any]], bool]] = []
        """Per learned site, in ``sites``' order, its check of the module's attributes
        (``attrs_check``), built when the site is learned."""
        self.fast: Callable[[Any, Any], Any] | None = None
        """The call of one learned site with its checks specialised to it, tried before ``serve``
        (``_fast``); set once its guard is settled (``Guard.settled``)."""
        self._fast_tried = False
        self.pending: Guard | None = None
        """The guard of the site ``serve`` last answered ``TIME_EAGER`` for."""
        self.memo = MissMemo(module, device)
        """The calls the interceptor served nothing of, once learning is over (``MissMemo``)."""

    def learning(self) -> bool:
        return self._useless < self.GIVE_UP

    def _attrs(self) -> tuple[tuple[str, Any, bool], ...]:
        """The module's attributes (``module_attrs``): a forward that rebinds an attribute on each
        call (a counter, a cached output) never shows the same site twice, and is not learned."""
        return module_attrs(self.module)

    def _tensors(self, args: Any) -> list[Any]:
        m = self.module
        return [*args, *(p for p in m._parameters.values() if p is not None),
                *(b for b in m._buffers.values() if b is not None)]

    def observe(self, args: Any, kwargs: Any, record: list[Any], ret: Any) -> None:
        """One call under the interceptor (``record``: what it dispatched, ``ret``: what the
        forward returned)."""
        import torch

        site = None
        if not kwargs and all(isinstance(a, torch.Tensor) for a in args) and record and record[-1][1] is not None:
            _, og, uniq, out, _ = record[-1]
            outs = [out] if og.single else list(out)
            ret_at = next((j for j, o in enumerate(outs) if o is ret), None)
            tensors = self._tensors(args)
            copies = _copied(record[:-1], tensors)
            if copies is not None:
                pool = [*tensors, *(rec[3] for rec in record[:-1])]
                where = [next((i for i, t in enumerate(pool) if t is u), -1) for u in uniq]
                if ret_at is not None and -1 not in where and \
                        all(len(tensors) + j in where for j in range(len(copies))):
                    site = (og, tuple(where), -1 if og.single else ret_at, len(args), self._attrs(),
                            _aliases(tensors), copies)
        if site is None:
            self._useless += 1
            self._candidate, self._seen = None, 0
            return
        if site in self.sites:
            return
        if site == self._candidate:
            self._seen += 1
        else:
            self._candidate, self._seen = site, 1
        if self._seen >= self.LEARN_CALLS:
            self.sites.append(site)
            self._same.append(attrs_check(site[4], self.module.__dict__))
            self._candidate, self._seen = None, 0

    def serve(self, args: Any, kwargs: Any) -> Any:
        """The forward's result from a learned site; NOT_SERVED when no site matches (the caller
        intercepts), FELL_BACK when the matching site's kernel failed (the caller runs PyTorch)."""
        if not self.sites or kwargs:
            return NOT_SERVED
        import torch

        if not plain_context(self.device):
            return NOT_SERVED
        tensors = None
        aliases = None
        for k, ((og, where, ret_at, n_args, _, site_aliases, copies), same) in enumerate(zip(self.sites, self._same)):
            if len(args) != n_args:
                continue
            if tensors is None:
                tensors = self._tensors(args)
                if not plain_tensors(tensors):
                    return NOT_SERVED
                if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                    return NOT_SERVED
                aliases = _aliases(tensors)
            if aliases != site_aliases:  # the same tensor passed twice, or no longer
                continue
            if not same(self.module.__dict__):
                continue
            if max(where, default=-1) >= len(tensors) + len(copies):
                continue
            pool = [*tensors, *(tensors[i].contiguous() for i in copies)] if copies else tensors
            inputs = [pool[i] for i in where]
            guard = og.guard
            if not guard.status.active or guard.mismatch(inputs):
                continue
            if guard.eager_pending:
                self.pending = guard
                return TIME_EAGER
            outs = guard.serve(inputs, checked_at=time.perf_counter_ns() if guard.timing() else 0,
                               keep=max(ret_at, 0))
            if outs is None:
                return FELL_BACK  # counted by serve (a kernel error): the caller runs PyTorch
            if self.fast is None and not self._fast_tried and guard.settled():
                self._fast_tried = True
                self.fast = self._fast(k, tensors)
            return outs[0] if ret_at < 0 else outs[ret_at]
        return NOT_SERVED

    def _fast(self, k: int, tensors: list[Any]) -> Callable[[Any, Any], Any] | None:
        """``serve`` for learned site ``k`` alone, its checks specialised to the site
        (``specialised``): every check ``serve`` makes, in one function instead of six, without
        their loops over the sites and the tensors, which cost the host more than the launch.
        None for a site it does not specialise (a call with more than one tensor, a tensor passed
        twice)."""
        import operator

        og, where, ret_at, n_args, _, site_aliases, copies = self.sites[k]
        if n_args != 1 or site_aliases != tuple(range(len(tensors))):
            return None
        take = operator.itemgetter(*where)
        one_input = len(where) == 1

        def arrange(x: Any, owned: tuple[Any, ...]) -> list[Any]:
            pool = (x, *owned)
            if copies:
                pool = (*pool, *(pool[i].contiguous() for i in copies))
            return [take(pool)] if one_input else list(take(pool))

        return specialised(og.guard, self.module, self.device, 1, tensors[1:], self._same[k], arrange,
                            max(ret_at, 0), where.index(0) if 0 in where else None)


def _copied(record: list[Any], tensors: list[Any]) -> tuple[int, ...] | None:
    """The call's tensors that ``record``'s ops (what a leaf's forward dispatched before its
    served op) copied, by index into ``tensors``, when every one of those ops is a contiguous
    copy of one of them (``aten.clone`` to the contiguous format, what ``Tensor.contiguous()``
    dispatches for a tensor that is not contiguous); None when any op is something else."""
    import torch

    out = []
    for func, og, _, _, call in record:
        if og is not None or func is not torch.ops.aten.clone.default or call is None:
            return None
        cargs, ckw = call
        if len(cargs) != 1 or ckw != {"memory_format": torch.contiguous_format}:
            return None
        i = next((k for k, t in enumerate(tensors) if t is cargs[0]), -1)
        if i < 0 or cargs[0].is_contiguous():
            return None
        out.append(i)
    return tuple(out)
