"""Op and chain cards served by a dispatch-mode interceptor entered around the modules they were
profiled at (around the whole forward for ops called outside any leaf module).

Nothing is intercepted for cards not promoted, so a model with nothing promoted runs exactly as
before. A scope's call goes first to its learned leaf site (``leaf.py``), then under the
interceptor, where every op of the scope passes through Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .chain import ChainGuard, Run, pending_in, realize_all, realize_returned, runs_of, tensor_storages
from .graph.callkeys import Leads
from .guard import FELL_BACK, NOT_SERVED, TIME_EAGER, Guard, gated
from .opmatch import OpGuard
from .trial import Trial

if TYPE_CHECKING:
    from .leaf import LeafSites


def interceptor_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Interceptor(TorchDispatchMode):  # type: ignore[misc]
        forge_interceptor = True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says
            # no: a few µs on every op of the scope. The interceptor serves eager models only
            # (torch_compile mode serves op and chain cards through Applied.backend() instead).
            return False

        def __init__(self, table: dict[Any, list[OpGuard]], owner: object = None,
                     chains: dict[Any, list[ChainGuard]] | None = None) -> None:
            super().__init__()
            self.table = table
            self.forge_owner = owner
            """The scope that pushed this mode (its children's forwards pop it: ``outside_scope``)."""
            self.record: list[tuple[Any, OpGuard | None, list[Any], Any, Any]] | None = None
            """When a list: every op dispatched, as (op, the card that served it or None, the
            distinct tensors it served, the result, and for an op no card served its (args,
            kwargs)) (``LeafSites`` learns from it)."""
            self.chains = chains
            """The scope's chain cards, by their first op (see ``chain.py``)."""
            self.runs: list[Run] = []
            """The chains begun in this call of the scope that may still matter: going on, or
            with a deferred value still referenced."""
            self.served = 0
            """Ops a card served in this call."""
            self.missed: list[tuple[Guard, str]] | None = None
            """When a list: each refusal counted in this call, (the guard, why) (``MissMemo``)."""

        def _chain(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            """A chain's answer to the call (a Pending tensor, or the kernel's output), or NOT_SERVED."""
            going = runs_of(args, kwargs) if pending_in(types) else ()
            for p in going:
                out = p._forge_run.chain.step(p, func, args, kwargs)
                if out is not None:
                    if p._forge_run.ended:
                        self.runs = [r for r in self.runs if r.matters()]
                    return out
            if self.runs and func._schema.is_mutable:  # an input of a chain may change: compute first
                written = tensor_storages(args, kwargs)
                for run in self.runs:
                    if written & run.storages():
                        run.end()
                self.runs = [r for r in self.runs if r.matters()]
            if self.chains is not None:
                for cg in self.chains.get(func, ()):
                    if not cg.guard.status.active:
                        continue
                    got = cg.start(func, args, kwargs)
                    if got is not None:
                        self.runs.append(got[1])
                        return got[0]
            return NOT_SERVED

        def flush(self) -> None:
            """At the scope's exit: every chain value still referenced is computed (see ``chain.py``)."""
            runs, self.runs = self.runs, []
            for run in runs:
                run.end()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            chains = self.chains
            if self.runs or (chains is not None and func in chains):
                out = self._chain(func, types, args, kwargs)
                if out is not NOT_SERVED:
                    return out
                if types:  # a deferred argument: computed for what reads it (a guard, eager's op)
                    args, kwargs = realize_all(args, kwargs)
            guards = self.table.get(func)
            record = self.record
            if guards:
                misses: list[tuple[OpGuard, str]] = []
                for g in guards:
                    uniq: list[Any] | None = [] if record is not None else None
                    out, why = g.try_serve(args, kwargs, uniq)
                    if why is None:
                        self.served += 1
                        if record is not None:
                            record.append((func, g, uniq or [], out, None))
                        return out
                    if why is TIME_EAGER:
                        out = g.guard.time_eager(lambda: func(*args, **kwargs))
                        if record is not None:
                            record.append((func, None, [], out, (args, kwargs)))
                        return out
                    misses.append((g, why))
                for g, why in misses:  # no card served the call: each says why not
                    if why:
                        g.guard.board.fell_back(g.guard.status, why)
                        if self.missed is not None:
                            self.missed.append((g.guard, why))
            out = func(*args, **kwargs)
            if record is not None:
                record.append((func, None, [], out, (args, kwargs)))
            return out

    return Interceptor


def outside_scope(original: Callable[..., Any], owner: object) -> Callable[..., Any]:
    """A child's forward that runs outside its parent scope's interception: an op card captured
    from the parent's own calls never matches a child's, and every op intercepted costs a trip
    through Python (the whole of a decoder layer's attention and MLP, for an ``add`` between
    them)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    target = [original]

    def forward(*args: Any, **kwargs: Any) -> Any:
        mode: Any = _get_current_dispatch_mode()
        if getattr(mode, "forge_owner", None) is owner:
            with _pop_mode_temporarily():
                if getattr(mode, "runs", None):  # a chain input the child is handed may change in it: compute first
                    given = tensor_storages(args, kwargs)
                    for run in mode.runs:
                        if given & run.storages():
                            run.end()
                return target[0](*args, **kwargs)
        return target[0](*args, **kwargs)

    def retarget(own: Callable[..., Any]) -> None:
        """Call ``own`` from now on (the module's own forward, once forge's below is taken out)."""
        target[0] = own

    forward.forge_retarget = retarget  # type: ignore[attr-defined]
    return forward


def intercepting(original: Callable[..., Any], interceptor: type, table: dict[Any, list[OpGuard]],
                  trial: Trial | None = None, owner: object = None, leaf: "LeafSites | None" = None,
                  chains: dict[Any, list[ChainGuard]] | None = None,
                  take_out: Callable[[Callable[..., Any]], bool] | None = None) -> Callable[..., Any]:
    """``original`` with the interceptor active while it runs (scopes nest: an op an inner scope
    does not serve goes on to the outer one, unless the outer scope's cards were captured from its
    own calls and its children run outside it). Every op of the scope then passes through Python, so
    with a ``trial`` the scope's first calls are tried with the interceptor and without, and the
    interceptor stays only if the scope ran faster with it; once every guard of the scope is off,
    the scope runs as it was, not intercepted. A leaf module (``leaf``) whose forward is one served
    op is called, once learned, without the interceptor (see ``LeafSites``). Another scope's call
    like one that served nothing (``Leads.unlike``: a decode step's, where the cards were profiled
    at the prompt's shapes) runs as written, not intercepted, and is no trial call."""
    groups: list[list[Any]] = [*table.values(), *(chains or {}).values()]
    guards = list({id(g.guard): g.guard for gs in groups for g in gs}.values())
    leads = Leads((k for g in guards for k in g.sig.scope_keys), original) if leaf is None else None
    if leads is not None and not leads.lead_rule:
        leads = None

    def servable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:  # a trial call: one not unlike
        return leads is None or not leads.empty_leads or not leads.unlike(leads.lead(args, kwargs))

    def intercepted(*args: Any, **kwargs: Any) -> Any:
        key = None
        """A leaf's call past its learning: remembered (``MissMemo``) if no card serves it."""
        if leaf is not None:
            fast = leaf.fast
            if fast is not None:
                out = fast(args, kwargs)
                if out is FELL_BACK:
                    return original(*args, **kwargs)
                if out is not NOT_SERVED:
                    return out
            if leaf.memo.known:
                key = leaf.memo.key(args, kwargs)
                known = leaf.memo.get(key) if key is not None else None
                if known is not None:  # refused like this before: counted again, not intercepted
                    for g, why in known:
                        g.board.fell_back(g.status, why)
                    return original(*args, **kwargs)
            out = leaf.serve(args, kwargs)
            if out is FELL_BACK:
                return original(*args, **kwargs)
            if out is TIME_EAGER and leaf.pending is not None:
                return leaf.pending.time_eager(lambda: original(*args, **kwargs))
            if out is not NOT_SERVED:
                return out
            if leaf.learning():
                mode = interceptor(table, owner, chains)
                mode.record = []
                try:
                    with mode:
                        ret = original(*args, **kwargs)
                finally:
                    mode.flush()
                leaf.observe(args, kwargs, mode.record, ret)
                return ret
            key = leaf.memo.key(args, kwargs)
        lead = None
        served = 0
        if leads is not None:
            lead = leads.lead(args, kwargs)
            if leads.empty_leads and leads.unlike(lead):
                leads.refused.add(lead)  # looked up first from now on (``refusing``)
                unserved().n += 1
                return original(*args, **kwargs)
            served = sum(g.status.served for g in guards)  # a chain's call counts there alone
        mode = interceptor(table, owner, chains)
        if key is not None:
            mode.missed = []
        ran = False
        try:
            with mode:
                ret = original(*args, **kwargs)
        finally:
            if mode.runs:
                ran = True
                mode.flush()
        if key is not None and leaf is not None and not mode.served and not ran:
            leaf.memo.put(key, mode.missed)
        if leads is not None:
            leads.note(lead, sum(g.status.served for g in guards) > served)
        return realize_returned(ret) if ran else ret

    tally: list[Any] = []

    def unserved() -> Any:
        """The count of calls run as written for ``UNSERVED_WHY`` (``status.Tally``)."""
        if not tally:
            tally.append(guards[0].board.tally([g.status for g in guards], UNSERVED_WHY))
        return tally[0]

    if leads is None or not guards:
        return gated(intercepted, original, guards, trial, None if leads is None else servable, take_out)
    outer: list[Callable[..., Any]] = []

    def take_out_outer(_: Callable[..., Any]) -> bool:
        return take_out is not None and take_out(outer[0])

    outer.append(refusing(gated(intercepted, original, guards, trial, servable,
                                take_out_outer if take_out is not None else None), original, leads.refused, unserved))
    return outer[0]


def refusing(forward: Callable[..., Any], original: Callable[..., Any], refused: set[Any],
             unserved: Callable[[], Any]) -> Callable[..., Any]:
    """``forward`` (an intercepted scope's, as ``apply`` serves it) behind one lookup: a call whose
    first argument is a plain tensor with a lead its scope found ``Leads.unlike`` (``refused``: a
    generation loop's decode steps, where the cards were profiled at the prompt's shapes) runs as
    written at once, counted in ``unserved()``'s tally as ``intercepted`` counts it; anything else
    goes through ``forward``, its trial and its checks, which such a call would pass only to run as
    written. What forge adds to such a call is this function's frame and one lookup."""
    import torch

    tensor = torch.Tensor
    tally: list[Any] = []

    def refusing_forward(*args: Any, **kwargs: Any) -> Any:
        if refused and args:
            x = args[0]
            if type(x) is tensor and (x.shape, x.dtype) in refused:
                if not tally:
                    tally.append(unserved())
                tally[0].n += 1
                return original(*args, **kwargs)
        return forward(*args, **kwargs)

    return refusing_forward


UNSERVED_WHY = "a call unlike those its scope served (new shapes): run as written, not intercepted"
