"""A module's forward compiled once by torch.compile, its cards' ops replaced (``GraphScope``)."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..direct import HOOKED, MISS, DirectCall, ModuleHooks, cache_entries, plain_context
from ..trace import TraceSinks
from .callkeys import Leads, call_key, key_text
from .matching import find, rewrite, rewrite_torch_level

if TYPE_CHECKING:
    import torch


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
        alike layer, where a copy a layer compiles once a layer. Off once a scope
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
    from ..direct import _HOOKS

    for m in module.modules():
        if m is not module and "forward" in m.__dict__:
            return False
        if any(m.__dict__.get(h) for h in _HOOKS):
            return False
    return True


class GraphScope:
    """A module's forward, compiled with its cards' ops replaced (see the module docstring)."""

    def __init__(self, module: "torch.nn.Module", original: Any, guards: list[Any], device: str,
                 book: VariantBook | None = None, sinks: TraceSinks | None = None) -> None:
        self.module = module
        self.sinks = sinks if sinks is not None else TraceSinks()
        """Where the trace of the scope's forward sends the fallbacks of the module cards below it
        (``trace.py``): the ``apply``'s own, which its module cards' forwards note to."""
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
        backend to count at every call of the graph (``sinks``)."""
        self._vs = _Variants()
        """The variants compiled in the code this scope compiles (``_Variants``): its own copy's,
        or its book's shared one's (``shared``)."""
        self.shared = False
        """Whether the scope compiles its book's shared copy of the code (``VariantBook.shared``),
        decided at its first compile."""
        self.uncovered = 0
        """Calls run as written because no compiled variant covered them once compiling stopped."""
        self._leave = False
        """Whether the scope leaves its book's shared copy after this call (``_count_variant``)."""
        self._keys: set[Any] = set()
        """The keys of the calls this scope compiled variants for."""
        self._tally: Any = None
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
            first the module cards whose calls the trace sent to PyTorch (``trace.note_traced``)."""
            scope._traced.clear()

            def compile_graph(agm: Any, inputs: Any) -> Any:
                sites: set[Any] = set()
                whys: list[tuple[Any, list[Any], str]] = []
                for g in scope.guards:
                    if g.status.active:
                        found_here: list[tuple[list[Any], str]] = []
                        for _, nodes in find(agm.graph, g.sig.program, g._specs, scope.device, found_here, g.ranged):
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
    (up to seconds for a real attention layer), and the cards serve the shapes they were profiled
    at: a generation loop whose every step meets new shapes would compile a variant a step for
    every layer, to Dynamo's limit, with nothing served in them. A scope stops at this many, and
    at the first variant its cards do not serve once one they do serve exists."""

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
        self._own_copy()
        return False

    def _own_copy(self) -> None:
        """Compile a copy of the forward of the scope's own from the next call (``compiled``:
        rehooked scopes, and those that leave a shared copy, do not share), every profiled call
        pending again."""
        self._compiled = self._clone = self._hooks = self._run_only = None
        self._not_covered.clear()
        self.direct, self.direct_why, self._direct_tried = None, None, False
        self._vs, self.shared, self.sites, self.levels, self.unmapped = _Variants(), False, {}, [], {}
        self._leave = False
        self.pending = set(self.book.profiled)

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
                not torch.compiler.is_compiling():
            lead = book.lead(args, kwargs)
            if book.unlike(lead):
                # like a call that compiled a variant serving nothing (a generation step): as
                # written, told by its lead before the other checks, the decorator's code and
                # ``_run``'s frames (through all of them a decode step's call costs the host far
                # more than eager's); the scope's forward looks it up first from now on
                book.refused.add(lead)
                self.calls += 1
                self._count_uncovered()
                return self.original(*args, **kwargs)
        if self._failed is not None or torch.is_grad_enabled() or \
                torch.compiler.is_compiling() or self._hooks_changed() or not plain_context(self.device) or \
                (self.device == "cuda" and self._compiled is None and torch.cuda.is_current_stream_capturing()):
            # under a mode or a transform (a __torch_function__ mode, autocast, vmap) the forward
            # runs as written: its module cards' own forwards then leave it to PyTorch
            return self.original(*args, **kwargs)
        self.calls += 1
        if self._wrapper is not None:  # the decorator's code as written; it calls ``_wrapped``
            return self._wrapper(self.module, *args, **kwargs)
        return self._run(self.original, args, kwargs)

    def refusing(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """``forward`` (the scope's, as ``apply`` serves it) behind one lookup: a call whose first
        argument is a plain tensor with a lead the book found ``unlike`` (``Leads.refused``: a
        generation loop's decode steps, where the cards were profiled at the prompt's shapes) runs
        the module's own forward at once, counted as ``__call__`` counts it (``_count_uncovered``,
        the count kept here and folded into the status when read: ``status.Tally``). Everything
        else goes through ``forward`` as before, its trial and the checks of ``__call__`` included:
        such a call would pass them all and run as written. What forge adds to a step's call is then
        this function's frame, a dictionary lookup and two flags, where the checks cost a decode
        loop several percent of eager's time."""
        import torch

        refused, original = self.book.refused, self.original
        tensor, grad = torch.Tensor, torch.is_grad_enabled
        tally: list[Any] = []

        # no ``is_compiling()`` here (two Python frames a call): where Dynamo traces a model
        # through this forward, the refused call's branch traces the module's own forward, as
        # ``__call__`` does while compiling, and the counts become side effects of each call
        def refusing_forward(*args: Any, **kwargs: Any) -> Any:
            if refused and args:
                x = args[0]
                if type(x) is tensor and (x.shape, x.dtype) in refused and self._failed is None and not grad():
                    if not tally:
                        tally.append(self.uncovered_tally())
                    tally[0].n += 1
                    self.calls += 1
                    self.uncovered += 1
                    return original(*args, **kwargs)
            return forward(*args, **kwargs)

        return refusing_forward

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
        sites = sum(self.sites.values())
        self.sinks.open(self._traced)
        outer, self.book.current = self.book.current, self
        try:
            out = self.compiled()(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            # raised before the forward ran: Dynamo failed on it, or our backend did
            self.failed = f"torch.compile failed on it: {type(exc).__name__}: {str(exc)[:300]}"
            return as_written(*args, **kwargs)
        finally:
            self.book.current = outer
            self.sinks.close()
            self._traced.clear()
        if profiled is not None:
            self.pending.discard(profiled)
        served = self._count_variant(sites, key, args, kwargs)
        if self.failed is not None:
            return out
        if self._leave:
            self._own_copy()
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
        mine = key in self._keys
        self._keys.add(key)
        if self.shared and key in self.book.serving | self.book.empty:
            # a call like one compiled before: Dynamo guards something of this module's own (a
            # layer's ``layer_idx``), and a shared cache would hold a variant a layer. Scopes
            # that compile later take copies of their own; so does this one from its next call
            # where an alike scope compiled that call (its variants in the shared copy would
            # count against the limit the others' share, and a layer's steps find it reached)
            self.book.shared = False
            self._leave = not mine
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
            self.book.refused.discard(lead)
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
        key, and a like call runs as written at once. The run-only wrapper is made once: made at
        each call, it cost a stopped scope's call a good part of eager's own time again."""
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
        if self.guards:
            self.guards[0].board.settle()
        return sum(g.status.served + sum(g.status.fallbacks.values()) for g in self.guards)

    def _count_uncovered(self) -> None:
        self.uncovered += 1
        self.uncovered_tally().n += 1

    def uncovered_tally(self) -> Any:
        """The count of the calls run as written (``UNCOVERED_WHY``) as fallbacks of each active
        card of the scope (``status.Tally``): kept by the caller, folded in by the board."""
        if self._tally is None:
            from ..status import Tally

            # one board holds an apply's cards
            self._tally = self.guards[0].board.tally(self._statuses, self.UNCOVERED_WHY) if self.guards \
                else Tally([], self.UNCOVERED_WHY)
        return self._tally


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
