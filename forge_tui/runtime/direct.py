"""A compiled scope's calls without Dynamo's frame machinery: Dynamo's guards, then Dynamo's code.

Dynamo runs a compiled function by installing its frame-evaluation callback, checking the guards
of its cache entries against the frame's locals, and running the code object it made for the
frame: the forward's bytecode rewritten to call the graph and to rebuild what the forward returns,
side effects included. That machinery, not the guards, is most of what a compiled scope costs the
host: through it a compiled scope can cost more than the eager forward it stands for, where its
guards and then its code, called directly, cost less (docs/runtime.md, "What the design rests on").

``DirectCall`` does just that for the variant Dynamo compiled first: the cache entry's own guard
manager checks the call (the arguments' tensors, the modules' attributes and parameters, the
globals the trace read, grad mode, autocast: whatever Dynamo guards), and where it passes, the
entry's code runs as a plain function. A call it refuses goes to Dynamo (which compiles again, or
runs Python). Dynamo does not guard on module hooks (``torch._dynamo.config.
skip_nnmodule_hook_guards``): where one was added to or removed from a module of the scope, or
for all modules, since the compile, the scope compiles again (``GraphScope``, a bounded number of
times), and a direct call made before the change runs the forward as written rather than leave the
hook out.

Where Dynamo broke the scope's graph (around a served leaf module: its kernel's call is kept out
of Dynamo's traces), its code calls a function of Dynamo's for the rest of the forward, which
Dynamo compiles on its own; those calls get direct calls too, under their own guards. A scope
gets no direct call, and says why, where Dynamo compiled more than one variant of it (or of the
code after a break) before the first call returned, or where this torch does not expose them.
Forwards with ``*args`` or ``**kwargs`` (Hugging Face's attention layers take ``**kwargs``) bind
their frames as Python does, free variables included (a forward that a decorator wrapped, as the
``kernels`` library wraps Hugging Face's layers, closes over the function it wraps).
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping

MISS = object()
"""What ``DirectCall.__call__`` returns for a call that Dynamo's guards refuse (Dynamo's to run)."""
HOOKED = object()
"""What it returns where a module hook was added or removed since the compile: the forward as
written is to run."""

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs",
                 "_global_forward_hooks_always_called")
_VARARGS, _VARKEYWORDS = 0x04, 0x08  # inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


class ModuleHooks:
    """The hooks of a scope's modules, and the global module hooks, as they were at the compile.

    Checked at every call of a scope, so cheaply where it can be: every hook that torch registers
    gets a handle numbered from one counter (``RemovableHandle.next_id``); while it has not moved,
    hooks can only have been removed, and their count says so. Where it moved (a hook registered
    anywhere in the process), the hooks themselves are compared, and the counter kept where they
    are the same."""

    def __init__(self, root: Any) -> None:
        from torch.nn.modules import module as nn_module
        from torch.utils.hooks import RemovableHandle

        self.dicts = tuple(m.__dict__[h] for m in root.modules() for h in _HOOKS if h in m.__dict__)
        self.dicts += tuple(getattr(nn_module, h) for h in _GLOBAL_HOOKS if hasattr(nn_module, h))
        self._handles = RemovableHandle
        self.next_id = RemovableHandle.next_id
        self.held = self._held()
        self.count = self._count()

    def _held(self) -> tuple[Any, ...]:
        return tuple(tuple(d.values()) if d else () for d in self.dicts)

    def _count(self) -> int:
        return sum(map(len, self.dicts))

    def same(self) -> bool:
        if self._handles.next_id == self.next_id:
            return self._count() == self.count
        if self._held() != self.held:
            return False
        self.next_id = self._handles.next_id
        return True


def cache_entries(function: Any) -> list[Any] | None:
    """Dynamo's cache entries for ``function``'s code (the variants it compiled, each with its
    code and guards), or None where this torch does not expose them."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return None
    return list(_debug_get_cache_entry_list(function.__code__))


_NESTING = 8
"""Graph breaks inside the code after a graph break, at most, for a direct call."""


def _direct(function: Any, depth: int = 0,
            frame: dict[str, Any] | None = None) -> tuple[Callable[..., Any] | None, Any, str | None]:
    """(Dynamo's code for ``function``'s one compiled variant as a plain function, the variant's
    guard check), or (None, None, why not). With ``frame`` (the forward's locals for a call), the
    variant whose guards pass that call, among several. Where Dynamo broke the graph, the code calls the
    function it made for what follows the break (``__resume_at_*``, compiled by Dynamo on its own
    when first called): here each such call goes to that function's own direct call, under its own
    guards, and to the function as written (the rest of the forward as Python: eager's ops) where
    they refuse it."""
    entries = cache_entries(function)
    if entries is None:
        return None, None, "this torch does not expose Dynamo's compiled code"
    where = "it" if depth == 0 else "the code after a graph break in it"
    if frame is not None and depth == 0 and len(entries) > 1:
        # the call's own guards may read what the call changed (a hook's closure it appended to):
        # with one variant, that one, as without ``frame``
        passing = [e for e in entries if getattr(e.guard_manager, "check", None) is not None
                   and e.guard_manager.check(frame)]
        if not passing:
            return None, None, f"none of the {len(entries)} variants Dynamo compiled of {where} takes the call"
        entry = passing[0]
    elif len(entries) != 1:
        return None, None, f"Dynamo compiled {len(entries)} variants of {where}"
    else:
        entry = entries[0]
    code = entry.code
    check = getattr(entry.guard_manager, "check", None)
    if check is None or code.co_freevars != function.__code__.co_freevars:
        return None, None, f"this torch's compiled code for {where} is not one it can call"
    scope = _lean_globals(function.__globals__, code)
    resumes = [n for n in code.co_names if n.startswith("__resume_at")]
    if resumes:
        if depth >= _NESTING:
            return None, None, f"its graph breaks nest more than {_NESTING} deep"
        # Dynamo's code finds the resume functions among the module's globals: this function's
        # own copy of them points those names at their direct calls (the rest it reads, Dynamo's
        # compiled graphs and helpers, are the module's own objects)
        for name in resumes:
            resume = function.__globals__.get(name)
            if not isinstance(resume, types.FunctionType):
                return None, None, f"Dynamo's code for {where} calls {name}, which is not a function"
            rfn, rcheck, why = _direct(resume, depth + 1)
            if rfn is None:
                return None, None, why
            scope[name] = _resumed(resume, rfn, rcheck)
    fn = types.FunctionType(code, scope, function.__name__, function.__defaults__, function.__closure__)
    fn.__kwdefaults__ = function.__kwdefaults__
    return fn, check, None


class _QuietUtils:
    """``torch._dynamo.utils`` as Dynamo's code reads it, less the profiler's range around the
    code before the graph (``record_pregraph_bytecode_enter``/``exit``: each call goes through two
    wrappers that switch Dynamo off and on again)."""

    def __init__(self, utils: Any) -> None:
        self._utils = utils

    def __getattr__(self, name: str) -> Any:
        return getattr(self._utils, name)

    @staticmethod
    def record_pregraph_bytecode_enter() -> Any:
        return _NO_RANGE

    @staticmethod
    def record_pregraph_bytecode_exit(cm: Any) -> None:
        return None


class _NoRange:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_RANGE = _NoRange()


def _lean_globals(scope: dict[str, Any], code: Any) -> dict[str, Any]:
    """A copy of the module globals ``scope`` for Dynamo's ``code`` run directly: its compiled
    graphs without the wrapper that switches Dynamo off around them (``torch._dynamo.disable``,
    a few µs of host a call), which a direct call does not need: it runs only where no Dynamo callback is set
    (``DirectCall.__call__``)."""
    try:
        from torch._dynamo.eval_frame import innermost_fn
    except ImportError:  # this torch names it otherwise: its code runs as Dynamo made it
        return dict(scope)
    lean = dict(scope)
    for name in code.co_names:
        value = scope.get(name)
        if name.startswith("__compiled_fn") and callable(value):
            lean[name] = innermost_fn(value)
        elif name == "__import_torch_dot__dynamo_dot_utils" and isinstance(value, types.ModuleType):
            lean[name] = _QuietUtils(value)
    return lean


def _resumed(original: Any, direct: Callable[..., Any], check: Any) -> Callable[..., Any]:
    """What Dynamo's code calls for the rest of the forward after a graph break: its compiled code
    where its guards pass, else the rest as written."""
    names = original.__code__.co_varnames[:original.__code__.co_argcount]

    def resume(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == len(names) and check(dict(zip(names, args))):
            return direct(*args)
        return original(*args, **kwargs)

    return resume


def plain_context(device: str) -> bool:
    """No transform or mode is active that a direct kernel call, or a compiled scope, would skip
    where PyTorch's own dispatch would honour it: autocast, a ``__torch_function__`` mode, a
    functorch transform (vmap, grad), a forward-mode AD level."""
    autocast, tf_modes, transforms, fwd_ad = CONTEXT_PROBES or context_probes()
    return not (autocast(device) or tf_modes() or transforms() is not None or fwd_ad._current_level >= 0)


CONTEXT_PROBES: list[Any] = []
"""What ``plain_context`` asks torch, looked up once (it runs on every directly served call)."""


def context_probes() -> list[Any]:
    import torch
    from torch.autograd import forward_ad

    CONTEXT_PROBES[:] = [torch.is_autocast_enabled, torch._C._len_torch_function_stack,
                         torch._C._functorch.peek_interpreter_stack, forward_ad]
    return CONTEXT_PROBES


_GET_CALLBACK: list[Callable[[], Any]] = []


def _callback() -> Any:
    """Dynamo's frame callback as set now (None outside any torch.compile'd call; True where this
    torch has no accessor for it, so that calls go to Dynamo)."""
    if not _GET_CALLBACK:
        try:
            from torch._C._dynamo.eval_frame import get_eval_frame_callback
        except ImportError:
            _GET_CALLBACK.append(lambda: True)
        else:
            _GET_CALLBACK.append(get_eval_frame_callback)
    return _GET_CALLBACK[0]()


def lead_place(args: tuple[Any, ...], kwargs: dict[str, Any],
               rank: Mapping[str, int] | None = None) -> tuple[int | None, str | None] | None:
    """Where a call's lead tensor is: (its position, None) for the first positional tensor, else
    (None, its name) for the keyword tensor that comes first among the forward's parameters
    (``rank``: ``param_rank``), then by name (the order of ``call_key``'s keywords); None where the
    call passes no tensor. A model's own forward called by keywords alone (a Hugging Face
    model's, in ``generate``) leads with its ``input_ids``, not the attention mask that sorts
    first by name and grows at every step."""
    import torch

    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            return i, None
    names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    if not names:
        return None
    if not rank:
        return None, min(names)
    last = len(rank)
    return None, min(names, key=lambda n: (rank.get(n, last), n))


def param_rank(forward: Any) -> dict[str, int]:
    """The names of ``forward``'s parameters that a call may pass by keyword, by their place in its
    signature (through ``functools.wraps``' ``__wrapped__``); empty where it has no readable
    signature (a wrapper of ``*args, **kwargs`` alone)."""
    import inspect

    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: i for i, p in enumerate(q for q in params if q.kind in kinds)}


def _unbound(*_: Any) -> Any:
    raise AssertionError("a DirectCall is called only once built (``DirectCall.build``)")


class DirectCall:
    """Dynamo's guards and code for one compiled variant of a scope's forward, run without
    Dynamo's frame machinery (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], check: Callable[[dict[str, Any]], bool], bound: Any,
                 code: Any, defaults: dict[str, Any], hooks: ModuleHooks | None, device: str,
                 closure: tuple[Any, ...] | None = None) -> None:
        self.fn = fn
        self.check = check
        self.bound = bound
        """The forward's ``self`` (the scope's module), passed first, as the frame had it."""
        n = code.co_argcount + code.co_kwonlyargcount
        self.names = code.co_varnames[:n]
        """The forward's named parameters, ``self`` first: the frame's locals the guards read,
        with ``varargs`` and ``varkw``."""
        self.index = {name: i for i, name in enumerate(self.names)}
        self.positional = code.co_argcount
        self.varargs = code.co_varnames[n] if code.co_flags & _VARARGS else None
        self.varkw = code.co_varnames[n + (self.varargs is not None)] if code.co_flags & _VARKEYWORDS else None
        self.cells = tuple(zip(code.co_freevars, closure or ()))
        """The forward's free variables and their cells: a forward made by a decorator (a wrapper
        closing over the function it wraps) has them among its frame's locals, and Dynamo guards
        them there. Read at each call: a cell's value may change."""
        self.size = n + (self.varargs is not None) + (self.varkw is not None) + len(self.cells)
        self.defaults = defaults
        self.hooks = hooks
        self.device = device
        self.calls = 0
        """Calls run directly."""
        self.lead: tuple[int | None, str | None, Any] | None = None
        """(position among the call's arguments, parameter name, shape) of the first tensor of
        the call the variant was picked for: compared before the frame is built. The variants
        are compiled for static shapes, so Dynamo's guards refuse a call whose tensor has another
        shape, and a generation step (a call at a shape nothing serves) is refused for the cost
        of one comparison, not of the frame and the guards (which cost more than a small
        attention layer's own eager call)."""

    @classmethod
    def build(cls, function: Any, module: Any, device: str, hooks: bool = True,
              call: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> tuple["DirectCall | None", str | None]:
        """The direct call of ``function`` (a scope's forward that Dynamo has compiled, called as a
        method of ``module``), or None and why not. ``hooks``: it checks the module hooks at each
        call (False where the caller does: ``GraphScope``). ``call`` (args, kwargs): of the
        variants Dynamo compiled, the one that call passes (else the one variant there is)."""
        code = function.__code__
        names = code.co_varnames[:code.co_argcount]
        defaults = dict(zip(names[len(names) - len(function.__defaults__ or ()):], function.__defaults__ or ()))
        defaults.update(function.__kwdefaults__ or {})
        direct = cls(_unbound, _unbound, module, code, defaults, ModuleHooks(module) if hooks else None, device,
                     function.__closure__)
        frame = None
        if call is not None:
            frame = direct.frame(*call)
            if frame is None:
                return None, "the call does not bind to the forward's parameters"
        fn, check, why = _direct(function, frame=frame)
        if fn is None or check is None:
            return None, why
        direct.fn, direct.check = fn, check
        if call is not None:
            direct.lead = direct._lead(*call)
        return direct, None

    def _lead(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, str | None, Any] | None:
        """``lead`` for a call: its lead tensor's place (``lead_place``), both ways the forward's
        parameters let it be passed, and its shape."""
        place = lead_place(args, kwargs)
        if place is None:
            return None
        i, name = place
        if i is not None:
            return i, (self.names[i + 1] if i + 1 < self.positional else None), args[i].shape
        assert name is not None
        j = self.index.get(name)
        return (j - 1 if j is not None and j < self.positional else None), name, kwargs[name].shape

    def refuses(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether the call's tensor in the place of ``lead`` has another shape (Dynamo's guards
        would refuse it)."""
        lead = self.lead
        if lead is None:
            return False
        i, name, shape = lead
        if i is not None and i < len(args):
            t = args[i]
        elif name is not None and name in kwargs:
            t = kwargs[name]
        else:
            return False
        return getattr(t, "shape", shape) != shape

    def frame(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The forward's frame locals for a call with ``args`` and ``kwargs`` (after ``self``), as
        Python binds them; None where they do not bind."""
        n = self.positional - 1
        frame = dict(self.defaults) if self.defaults else {}
        frame.update(zip(self.names, (self.bound, *args[:n])))
        if self.varargs is not None:
            frame[self.varargs] = tuple(args[n:])
        elif len(args) > n:
            return None
        extra: dict[str, Any] = {}
        for k, v in kwargs.items():
            i = self.index.get(k)
            if i is None:
                if self.varkw is None:
                    return None
                extra[k] = v
            elif i == 0 or (i < self.positional and i <= len(args)):
                return None  # given twice
            else:
                frame[k] = v
        if self.varkw is not None:
            frame[self.varkw] = extra
        for name, cell in self.cells:
            try:
                frame[name] = cell.cell_contents
            except ValueError:  # an empty cell is no local of the frame
                return None
        return frame if len(frame) == self.size else None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The forward's value; ``HOOKED`` where a module hook changed since the compile; ``MISS``
        where Dynamo's guards refuse the call (or it does not bind to the forward's parameters)."""
        if self.hooks is not None and not self.hooks.same():
            return HOOKED
        if _callback() is not None:
            return MISS  # under an outer compile: Dynamo's own path, its wrappers included
        if self.lead is not None and self.refuses(args, kwargs):
            return MISS
        frame = self.frame(args, kwargs)
        if frame is None or not self.check(frame):
            return MISS
        self.calls += 1
        return self.fn(self.bound, *args, **kwargs)
