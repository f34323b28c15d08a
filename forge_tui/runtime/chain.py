"""Serving chain cards: ops that a module's own forward calls one after another, fused.

A chain card (``kind == "chain"``) is a run of pointwise, cast and reduction ops in a module's own
forward, each taking an output of one before it: Hugging Face's eager attention computes
``softmax(scores * scale + mask, dtype=float32).to(bf16)`` as five aten calls, each a full pass
over the scores. One kernel computes the last op's output from the chain's inputs in one pass.

Eager code calls the ops one at a time, so at the first op the runtime cannot know that the last
will come. The scope's interceptor answers each op of a matching chain with a ``Pending`` tensor:
a stand-in without storage, with the output's shape, dtype and (contiguous) strides, that
remembers how eager computes it. When the chain's last op arrives on the chain's own Pending
tensors, the kernel computes its output from the chain's inputs and the intermediates are never
computed. Whatever else reads a Pending tensor computes it first, as eager would have, and reads
that: a chain that does not complete, or an intermediate the code keeps and reads, costs the eager
ops again, never a wrong value.

What would make a deferred value differ from eager's is an input changed in place between the op
and the read. So: an in-place op in the scope on a tensor sharing storage with a chain's inputs,
or a child module called with such a tensor, first computes every live intermediate of that chain
and ends it; at the scope's exit every intermediate still referenced (returned, stored) is
computed before the caller sees it. An input changed where none of this can see it (a child that
reaches it through an attribute) makes the read raise, naming the cause, rather than return a
value eager would not have. Python code that asks a Pending tensor for its storage (``data_ptr``)
fails as it would for any tensor without one.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..program import encodes_as, refs, resolve_op
from .kernel import contiguous_strides

_PENDING_CLASS: Any = None


class ChainInputChanged(RuntimeError):
    """A deferred chain value was read after one of its inputs changed where the runtime could not see it."""


def pending_class() -> Any:
    """The ``Pending`` tensor subclass (made on first use: torch is imported lazily)."""
    global _PENDING_CLASS
    if _PENDING_CLASS is not None:
        return _PENDING_CLASS
    import torch
    from torch.utils._pytree import tree_map

    make = torch.Tensor._make_wrapper_subclass

    class Pending(torch.Tensor):
        """A chain op's output that has not been computed: eager's computation of it, deferred."""

        _forge_fn: Any
        _forge_value: Any
        _forge_run: Any
        _forge_step: int

        @staticmethod
        def __new__(cls, shape: Any, strides: Any, dtype: Any, device: Any, fn: Any, run: Any, step: int) -> "Pending":
            r = make(cls, shape, strides=strides, dtype=dtype, device=device, requires_grad=False)
            r._forge_fn = fn
            r._forge_value = None
            r._forge_run = run
            r._forge_step = step
            return r

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()

        def forge_value(self) -> "torch.Tensor":
            """The value, computed as eager would on first use (and kept). A computation that
            raises raises again on the next read (it is kept until it succeeds)."""
            if self._forge_value is None:
                self._forge_value = self._forge_fn()
                self._forge_fn = None
            return self._forge_value

        def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
            return repr(self.forge_value())

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
            r_args, r_kwargs = tree_map(_realize, (args, kwargs or {}))
            out = func(*r_args, **r_kwargs)
            if func._schema.is_mutable and args and type(args[0]) is Pending:
                return args[0]  # an in-place op wrote the computed value: the caller keeps its tensor
            return out

    _PENDING_CLASS = Pending
    return Pending


def _realize(x: Any) -> Any:
    return x.forge_value() if _PENDING_CLASS is not None and type(x) is _PENDING_CLASS else x


def realize_all(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """The arguments with every Pending tensor among them computed."""
    from torch.utils._pytree import tree_map

    return tree_map(_realize, (args, kwargs))


def realize_returned(ret: Any) -> Any:
    """A scope's return value with its chain values as plain tensors (computed at the exit)."""
    if _PENDING_CLASS is None:
        return ret
    from torch.utils._pytree import tree_map

    return tree_map(_realize, ret)


def pending_in(types: Any) -> bool:
    """Whether a ``__torch_dispatch__`` call's ``types`` (the tensor subclasses among its
    arguments, nested ones included) holds Pending."""
    return bool(types) and _PENDING_CLASS is not None and _PENDING_CLASS in types


class Run:
    """One chain in progress in one call of its scope: the inputs bound so far (and their
    versions then), its ops' Pending outputs (weakly: what the code drops dies)."""

    __slots__ = ("chain", "inputs", "versions", "links", "ended", "__weakref__")

    def __init__(self, chain: "ChainGuard") -> None:
        self.chain = chain
        self.inputs: list[Any] = [None] * chain.n_inputs
        self.versions: list[int] = [0] * chain.n_inputs
        self.links: list[Any] = []
        self.ended = False

    def check_inputs(self) -> None:
        for k, t in enumerate(self.inputs):
            if t is not None and t._version != self.versions[k]:
                raise ChainInputChanged(
                    f"forge: input {k} of chain card {self.chain.guard.entry.card} was changed in place before a "
                    "deferred value computed from it was read, where the runtime could not see it (switch the card "
                    "off with forge reject, or report the model)")

    def storages(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self.inputs if t is not None}

    def matters(self) -> bool:
        """Whether the run can still go on, or holds a deferred value still referenced."""
        if not self.ended:
            return True
        for ref in self.links:
            p = ref()
            if p is not None and p._forge_value is None:
                return True
        return False

    def end(self) -> None:
        """Compute every intermediate still referenced, and take no further op."""
        self.ended = True
        for ref in self.links:
            p = ref()
            if p is not None and p._forge_value is None:
                p.forge_value()


class ChainGuard:
    """A chain card in one scope: matches its ops one by one, and serves the last."""

    def __init__(self, guard: Any, plain_equal: Any) -> None:
        import torch

        self.guard = guard
        program = guard.sig.program
        self.nodes = [(resolve_op(n["op"]), n.get("args", []), n.get("kwargs", {})) for n in program["nodes"]]
        self.outs: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = []
        """Each node's first output: (shape, contiguous strides, dtype), what its Pending has."""
        for n in program["nodes"]:
            shape, dtype = n["out"][0][0], n["out"][0][1]
            self.outs.append((tuple(shape), tuple(contiguous_strides(list(shape))), getattr(torch, dtype)))
        self.head = self.nodes[0][0]
        self.linear = all(k - 1 in refs([n.get("args", []), n.get("kwargs", {})], "$node")
                          for k, n in enumerate(program["nodes"]) if k)
        """Whether each op reads the one before: how the interceptor follows a run (from its latest
        link). A chain whose ops also read its inputs (rotate-half's slices) is served in compiled
        scopes alone."""
        self.n_inputs = len(guard.sig.inputs)
        self._specs = guard._specs
        self._plain_equal = plain_equal
        self._tensor_types = (torch.Tensor, torch.nn.Parameter)

    def _bind(self, run: Run, i: int, args: Any, kwargs: Any) -> bool:
        """Whether the call is the chain's op ``i`` on the run's tensors, binding the inputs it
        names the first time."""
        _, enc_args, enc_kwargs = self.nodes[i]
        if len(args) != len(enc_args) or len(kwargs) != len(enc_kwargs):
            return False
        unbound = [k for k, t in enumerate(run.inputs) if t is None]
        ok = all(self._match(run, a, e) for a, e in zip(args, enc_args)) and \
            all(k in kwargs and self._match(run, kwargs[k], e) for k, e in enc_kwargs.items())
        if not ok:
            for k in unbound:  # a call that is not the op binds nothing
                run.inputs[k] = None
        return ok

    def _match(self, run: Run, a: Any, e: Any) -> bool:
        if type(e) is dict:
            if "$node" in e:
                n = e["$node"]
                return e.get("out", 0) == 0 and n < len(run.links) and run.links[n]() is a and a._forge_value is None
            if "$in" in e:
                k = e["$in"]
                if type(a) is _PENDING_CLASS:
                    if a._forge_run is run:
                        return False  # the run's own link where the chain reads an input
                    a = a.forge_value()  # another chain's deferred value: eager computes it here too
                if type(a) not in self._tensor_types:
                    return False
                if run.inputs[k] is None:
                    dtype, shape, _ = self._specs[k]
                    if a.dtype is not dtype or a.shape != shape:
                        return False
                    run.inputs[k] = a
                    run.versions[k] = a._version
                    return True
                return run.inputs[k] is a
            return encodes_as(a, e)  # a dtype, device, layout, memory format or special float
        if type(e) is list and isinstance(a, (list, tuple)):
            return len(a) == len(e) and all(self._match(run, x, y) for x, y in zip(a, e))
        if isinstance(a, self._tensor_types[0]):
            return False
        return bool(self._plain_equal(a, e))

    def start(self, func: Any, args: Any, kwargs: Any) -> tuple[Any, Run] | None:
        """The chain's first op: (its Pending output, the run), or None (not this chain's call)."""
        import torch

        run = Run(self)
        if not self._bind(run, 0, args, kwargs):
            return None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in run.inputs):
            return None
        return self._link(run, 0, func, args, kwargs), run

    def _link(self, run: Run, i: int, func: Any, args: Any, kwargs: Any) -> Any:
        shape, strides, dtype = self.outs[i]
        device = next(t for t in run.inputs if t is not None).device

        def eager() -> Any:
            run.check_inputs()
            r_args, r_kwargs = realize_all(args, kwargs)
            with outside_interceptor():  # eager's op, not a chain's next link
                return func(*r_args, **r_kwargs)

        p = pending_class()(shape, strides, dtype, device, eager, run, i)
        run.links.append(weakref.ref(p))
        return p

    def step(self, p: Any, func: Any, args: Any, kwargs: Any) -> Any:
        """The next op of ``p``'s run: a Pending output, the kernel's output for the last op, or
        None (not the chain's next op: the caller computes what it reads)."""
        run: Run = p._forge_run
        i = len(run.links)
        if run.ended or i >= len(self.nodes) or self.nodes[i][0] is not func or not self._bind(run, i, args, kwargs):
            return None
        if i < len(self.nodes) - 1:
            return self._link(run, i, func, args, kwargs)
        run.ended = True
        if any(t is None for t in run.inputs):
            return None
        run.check_inputs()
        outs = self.guard.serve(run.inputs)
        if outs is None:  # the guard counted why; eager computes it
            return None
        return outs[0]


class outside_interceptor:
    """While it is active, the innermost dispatch mode, when it is a forge interceptor, is popped:
    a deferred value is computed by eager's op, never matched as a chain's link (which would defer
    it again). Inside an interceptor's own ``__torch_dispatch__`` the mode is off already."""

    __slots__ = ("_ctx",)

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

        self._ctx = None
        if getattr(_get_current_dispatch_mode(), "forge_interceptor", False):
            self._ctx = _pop_mode_temporarily()
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def runs_of(args: Any, kwargs: Any) -> list[Any]:
    """The Pending tensors among the call's arguments that may continue their runs (each the
    latest link of a run still going), latest step first."""
    pending = _PENDING_CLASS
    found: list[Any] = []
    for a in (*args, *kwargs.values()):
        if type(a) is pending and a._forge_value is None and not a._forge_run.ended and \
                a._forge_step == len(a._forge_run.links) - 1 and all(f is not a for f in found):
            found.append(a)
    if len(found) > 1:
        found.sort(key=lambda p: -p._forge_step)
    return found


def tensor_storages(args: Any, kwargs: Any) -> set[int]:
    import torch

    from ..program import tensor_leaves

    return {t.untyped_storage().data_ptr() for t in tensor_leaves((args, kwargs))
            if type(t) is torch.Tensor or type(t) is torch.nn.Parameter}
