"""Compiled scopes: a module's forward compiled once with its cards' ops replaced, its variants,
its direct calls of Dynamo's code, the call keys and leads that decide what compiles, and module
cards in its graph."""

import contextlib
import sys

import pytest
import torch
from runtime_helpers import (
    CFG,
    CPU,
    HERE,
    count_intercepted,
    count_scope_compiles,
    load_workload,
    one_card_promoted,
    promoted_workspace,
    scope_calls,
    three_alike_calls,
)

from forge_tui.evaluator import Evaluator
from forge_tui.promotion import manifest, promote_kernel
from forge_tui.runtime.apply import apply
from forge_tui.runtime.graph import scope as scope_mod


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_a_module_card_defines_its_graph_op_only_below_a_compiled_scope(promoted):
    """The custom op a scope's graph calls for a module card (``IN_GRAPH``) is defined when a
    compiled scope above the module asks for it: a model with no scope defines none (every apply
    of a card would otherwise add an operator to the process)."""
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        with apply(model, ws, cards=[norm.id], only_faster=False, trial_calls=0) as applied:
            model(x)
            assert not applied.scopes and applied.guards[norm.id].own_op is None
        with apply(model, ws, only_faster=False, trial_calls=0) as applied:
            model(x)
            assert list(applied.scopes) == [""] and applied.guards[norm.id].own_op is not None


def test_an_op_card_in_a_compiled_scope_is_served_with_no_op_intercepted(promoted, monkeypatch):
    """The same card with the scope compiled (the default): the softmax in the scope's aten graph
    is replaced by the kernel's call, and no op of the forward passes the interceptor."""
    ws, norm, sm = promoted
    seen = count_intercepted(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, cards=[sm.id], only_faster=False) as applied:
            got = [model(x) for _ in range(2)]
            st = {c["card"]: c for c in applied.status()["cards"]}
            assert list(applied.scopes) == [""] and applied.scopes[""].sites == {sm.id: 1}
    for g in got:
        torch.testing.assert_close(g, expected)
    assert st[sm.id]["served"] == 2 and seen == []


def test_a_compiled_scope_runs_dynamos_code_directly_while_calls_are_alike(promoted):
    """After the call that compiles it, a scope runs the code Dynamo made for that call without
    Dynamo (its per-call machinery cost the H200 host more than the kernels saved): same results,
    the kernel served in each call."""
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
    outs, scope, st = scope_calls(promoted, model, lambda m: [m(x.clone()) for _ in range(4)])
    for o in outs:
        torch.testing.assert_close(o, expected)
    assert scope.direct is not None, scope.direct_why
    assert scope.direct.calls == 3 and st["served"] == 4
    # its graphs are called without the wrapper that switches Dynamo off around them (nothing to
    # switch off on the direct path: 4 µs a call of the decoder's attention on the CPU)
    graphs = [v for n, v in scope.direct.fn.__globals__.items() if n.startswith("__compiled_fn")]
    assert graphs and not any(hasattr(g, "_torchdynamo_orig_callable") for g in graphs), graphs


@pytest.mark.parametrize("first", ["profiled", "odd"])
def test_a_scope_stops_compiling_for_shapes_its_cards_do_not_serve(promoted, monkeypatch, first):
    """A generation loop meets new shapes at every step: a scope compiled a variant for each (to
    Dynamo's limit of 8), with nothing served in them. It compiles none after the first variant its
    cards do not serve once one they serve exists (``first="odd"``: a first call at another shape
    compiles a variant that serves nothing, and the profiled shape's variant is still compiled,
    served, and then run by the direct call). Calls no variant covers then run as written and are
    counted as fallbacks with their reason; every output agrees with eager's."""
    from forge_tui.runtime import graph as graph_mod

    compiles = count_scope_compiles(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    odd = [torch.randn(n, 256) for n in (3, 5)] if first == "odd" else []
    steps = [torch.randn(n, 256) for n in (1, 2, 4, 6, 7, 9, 10, 11, 12)]

    def calls(m):
        got = [(t, m(t)) for t in odd]
        got += [(x, m(x.clone())) for _ in range(3)]
        got += [(t, m(t)) for t in steps]
        got += [(x, m(x.clone())) for _ in range(2)]
        return got

    outs, scope, st = scope_calls(promoted, model, calls)
    with torch.no_grad():
        for t, o in outs:
            torch.testing.assert_close(o, model(t))
    assert st["served"] == 5, st
    if first == "profiled":
        # the profiled variant, then the first step's, which serves nothing: no more compiles
        assert len(compiles) == 2 and scope.variants == 2 and scope.serving == [1]
        assert scope.direct is not None and scope.direct.calls == 4
        uncovered = len(steps) - 1
        assert scope.stopped and "holds none of its cards' sites" in scope.stopped
    else:
        # odd shapes first (two variants serving nothing), then the profiled one: the limit
        assert len(compiles) == 3 and scope.variants == 3 and scope.serving == [3]
        assert scope.stopped == "it compiled 3 variants, its limit"
        # the direct call now runs the variant that serves, not the first call's
        assert scope.direct is not None and scope.direct_variant == 3 and scope.direct.calls == 4
        uncovered = len(steps)
    assert scope.uncovered == uncovered
    assert st["fallbacks"].get(graph_mod.GraphScope.UNCOVERED_WHY, 0) == uncovered


def test_a_scope_compiles_at_most_its_limit_of_variants(promoted):
    """Calls whose shapes no card serves, from the first: compiles stop at ``MAX_VARIANTS``, and
    the calls after run as written."""
    from forge_tui.runtime.graph import GraphScope

    wl = load_workload()
    model = wl.get_model()
    shapes = [torch.randn(n, 256) for n in range(1, 8)]
    outs, scope, st = scope_calls(promoted, model, lambda m: [(t, m(t)) for t in shapes])
    with torch.no_grad():
        for t, o in outs:
            torch.testing.assert_close(o, model(t))
    assert scope.variants == GraphScope.MAX_VARIANTS and scope.serving == []
    assert scope.stopped == f"it compiled {GraphScope.MAX_VARIANTS} variants, its limit"
    assert scope.uncovered == len(shapes) - GraphScope.MAX_VARIANTS and st["served"] == 0


def test_the_profile_records_the_calls_a_cards_ops_were_made_in(promoted):
    """The softmax op card was made in the model's own forward, called with one (16, 256) fp32
    tensor: its card (and the manifest's signature) records that call's key, once."""
    from forge_tui.runtime.graph import call_key, key_text
    from forge_tui.runtime.manifest import Manifest

    ws, norm, sm = promoted
    x = load_workload().get_inputs()[0]
    assert sm.scope_keys == [key_text(call_key((x,), {}))]
    assert "(16, 256)" in sm.scope_keys[0] and "torch.float32" in sm.scope_keys[0]
    man = Manifest.load(ws.root / "kernels")
    assert man.entries[sm.id].signature.scope_keys == sm.scope_keys


@pytest.mark.parametrize("recorded", [True, False])
def test_a_profiled_call_compiles_after_the_limits_are_spent(promoted, recorded):
    """A model called first at three other shapes (a warm-up) spends its scope's compiles on
    variants that serve nothing (``MAX_VARIANTS``, the book's ``EMPTY_BUDGET``). The profiled
    call still compiles its variant, which serves, and the direct call runs it after; calls at
    other shapes then run as written. A workspace without the profiled calls recorded
    (``recorded=False``, as before they were) never serves the profiled shape."""
    from forge_tui.runtime.graph import GraphScope

    ws, _, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    warm = [torch.randn(n, 256) for n in (3, 5, 6)]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False) as applied:
        scope = applied.scopes[""]
        if not recorded:
            scope.book.profiled = frozenset()
        outs = [(t, model(t)) for t in warm]
        assert scope.variants == GraphScope.MAX_VARIANTS and scope.stopped
        outs += [(x, model(x.clone())) for _ in range(3)] + [(t, model(t)) for t in warm[:1]]
        st = {c["card"]: c for c in applied.status()["cards"]}[sm.id]
    with torch.no_grad():
        for t, o in outs:
            torch.testing.assert_close(o, model(t))
    if recorded:
        assert st["served"] == 3 and scope.variants == 4 and scope.serving == [4]
        assert scope.direct is not None and scope.direct_variant == 4 and scope.direct.calls == 2
        assert not scope.pending and scope.uncovered == 1
    else:
        assert st["served"] == 0 and scope.variants == 3 and scope.uncovered == 4


def test_a_book_tells_calls_like_ones_that_served_nothing_by_their_first_tensor():
    """The lead of a call (its first tensor's shape and dtype, positional first, else the keyword
    whose name sorts first) is read back from a profiled call's key text; a lead whose variant
    served nothing is ``unlike`` unless a served or a profiled call had it too."""
    from forge_tui.runtime.graph import VariantBook, call_key, call_lead, key_text

    x, mask = torch.zeros(2, 16, 64), torch.zeros(1, 16)
    profiled = key_text(call_key((), {"mask": mask, "hidden": x, "flag": True}))
    book = VariantBook([profiled])
    assert call_lead((), {"mask": mask, "hidden": x}) == ((2, 16, 64), torch.float32)
    assert call_lead((mask,), {"hidden": x}) == ((1, 16), torch.float32)
    assert book.profiled_leads == {((2, 16, 64), torch.float32)}
    step = call_lead((), {"hidden": torch.zeros(2, 1, 64, dtype=torch.bfloat16)})
    assert step == ((2, 1, 64), torch.bfloat16) and not book.unlike(step)
    book.empty_leads.add(step)
    assert book.unlike(step)
    book.serving_leads.add(step)
    assert not book.unlike(step)
    book.empty_leads.add(((2, 16, 64), torch.float32))
    assert not book.unlike(((2, 16, 64), torch.float32))  # the profiled call's
    assert call_lead((1, "a"), {"n": 3}) is None
    # a plain value that Python's literals cannot write (inf) still reads back
    scaled = key_text(call_key((x,), {"scale": float("inf")}))
    assert VariantBook([scaled]).profiled_leads == {((2, 16, 64), torch.float32)}
    # a text that does not read back: the rule never answers yes (it could refuse a profiled call)
    for unread in (VariantBook(["((torch.float32, nonsense"]), VariantBook()):  # or none recorded
        unread.empty_leads.add(step)
        assert not unread.lead_rule and not unread.unlike(step)


def test_a_call_key_takes_tensors_without_sizes():
    """The profile keys every module call, the runtime every scope call it refuses: a nested
    tensor (no sizes, no strides) gets a key of its kind, positional or by keyword, not an error."""
    import warnings

    from forge_tui.runtime.graph import call_key, key_text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    for args, kwargs in (((nested,), {}), ((), {"x": nested}), ((torch.ones(2), nested), {})):
        key = call_key(args, kwargs)
        assert key == call_key(args, kwargs) and "torch.float32" in key_text(key)
    assert call_key((nested,), {}) != call_key((torch.ones(2, 3),), {})


def test_a_book_stops_looking_for_profiled_calls_after_its_limit():
    """A generation loop whose profiled call never comes (a new shape each step) looks each call
    up once, and after ``LOOKS`` distinct calls the book looks no more."""
    from forge_tui.runtime.graph import VariantBook, call_key, key_text

    x = torch.zeros(16, 256)
    book = VariantBook([key_text(call_key((x,), {}))])
    assert book.profiled_text(call_key((torch.zeros(16, 256),), {})) is not None
    for n in range(1, VariantBook.LOOKS):
        assert book.profiled_text(call_key((torch.zeros(n, 7),), {})) is None
        assert book.profiled  # still looking
    assert book.profiled_text(call_key((torch.zeros(1, 8),), {})) is None and not book.profiled


def test_a_direct_call_refuses_another_shape_before_building_the_frame(promoted, monkeypatch):
    """The direct call compares the shape of the call's first tensor with the one its variant was
    compiled for before it binds the frame and runs Dynamo's guards: a call at another shape goes
    to Dynamo at once; a call at the compiled shape is bound, checked and run directly."""
    from forge_tui.runtime.direct import DirectCall

    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    frames: list[int] = []
    real = DirectCall.frame

    def counting(self, args, kwargs):
        frames.append(1)
        return real(self, args, kwargs)

    def calls(m):
        m(x)
        monkeypatch.setattr(DirectCall, "frame", counting)
        outs = [m(torch.randn(4, 256)), m(x.clone())]
        return outs

    outs, scope, st = scope_calls(promoted, model, calls)
    assert scope.direct is not None and scope.direct.lead is not None
    assert scope.direct.lead[2] == x.shape
    assert frames == [1] and scope.direct.calls == 1  # the (16, 256) call's alone
    with torch.no_grad():
        torch.testing.assert_close(outs[1], model(x))


def test_a_direct_call_under_dynamos_callback_goes_to_dynamo(promoted, monkeypatch):
    """Where a Dynamo callback is set (the scope runs inside an outer torch.compile'd call), the
    direct call, which leaves out Dynamo's wrappers around its graphs, hands the call to Dynamo."""
    from forge_tui.runtime import direct

    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)

    def calls(m):
        m(x)
        monkeypatch.setattr(direct, "_GET_CALLBACK", [lambda: object()])
        return m(x)

    out, scope, st = scope_calls(promoted, model, calls)
    torch.testing.assert_close(out, expected)
    assert scope.direct is not None and scope.direct.calls == 0 and st["served"] == 2


@pytest.mark.parametrize("change, direct", [("shape", False), ("attribute", False), ("autocast", False),
                                            ("hook", False), ("global hook", False),
                                            ("parameter", True), ("keyword", True)])
def test_a_call_unlike_the_compiled_one_goes_to_dynamo(promoted, change, direct):
    """Dynamo's own guards decide whether a call runs its code directly; and the model computes
    what its forward now says. Another input shape, a module attribute the graph baked in (the
    RMSNorm's epsilon) or autocast go to Dynamo. A hook added (to a module of the scope, or for all
    modules) compiles the scope again, a fresh direct call after it: Dynamo's graph would leave it
    out, and Dynamo does not guard on hooks. A parameter replaced
    by one like it, or the input passed by keyword, leave the frame as Dynamo guards it, and run
    directly (the code reads the parameter as it is now)."""
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    seen = []

    def calls(m):
        m(x)
        m(x)  # direct
        ctx = contextlib.nullcontext()
        arg = x
        if change == "shape":
            arg = torch.randn(8, 256)
        elif change == "attribute":
            m.norm.variance_epsilon = 0.5
        elif change == "parameter":
            m.norm.weight = torch.nn.Parameter(torch.full((256,), 3.0))
        elif change == "hook":
            m.norm.register_forward_hook(lambda mod, a, o: seen.append(1))
        elif change == "global hook":
            handles.append(torch.nn.modules.module.register_module_forward_hook(
                lambda mod, a, o: seen.append(1) if mod is m.norm else None))
        elif change == "autocast":
            ctx = torch.autocast("cpu", dtype=torch.bfloat16)
        with ctx:
            got = m(x=arg) if change == "keyword" else m(arg)
        with ctx:
            want = type(m).forward(m, arg)  # the forward as written, on the model as it is now
        return got, want

    handles: list = []
    try:
        (got, want), scope, _ = scope_calls(promoted, model, calls)
    finally:
        for h in handles:
            h.remove()
    hooked = "hook" in change
    assert scope.direct is not None and scope.direct.calls == (2 if direct else 0 if hooked else 1), scope.direct_why
    assert scope.rehooks == (1 if hooked else 0)
    torch.testing.assert_close(got, want)
    if hooked:
        assert seen == [1, 1]  # the hooked call, and the forward as written


def test_a_scope_whose_graph_breaks_is_called_directly_on_both_sides_of_the_break(promoted, monkeypatch):
    """Dynamo compiles the code after a graph break on its own (a scope compiled around a served
    leaf module breaks there): the direct call runs that code's compiled variant too, under its
    own guards, so the softmax after the break is still served."""

    wl = load_workload()
    monkeypatch.setitem(sys.modules, wl.__name__, wl)  # Dynamo imports the module of the class below's base

    class Breaking(type(wl.get_model())):
        def forward(self, x):
            h = self.norm(x)
            torch._dynamo.graph_break()
            return torch.softmax(h, dim=-1)

    scope, st = three_alike_calls(promoted, wl, Breaking)
    assert scope.direct is not None and scope.direct.calls == 2, scope.direct_why
    assert st["served"] == 3  # after the break, in each call
    # the piece before the break has no card: Dynamo's graph as traced, not the aten graph (every
    # aten op a Python call: on the H200 host the Gemma-3 attention's first piece cost more than
    # its chain saved)
    assert scope.levels == ["torch", "torch"], scope.levels


def test_a_scope_whose_forward_a_decorator_wrapped_is_called_directly(promoted, monkeypatch):
    """A forward that a decorator replaced by a wrapper closing over the original (as the
    ``kernels`` library wraps Hugging Face's layers): Dynamo guards the closure's variables among
    the frame's locals, and the direct call binds them too."""
    import functools

    wl = load_workload()
    monkeypatch.setitem(sys.modules, wl.__name__, wl)

    def wrapped(orig_forward):
        @functools.wraps(orig_forward)
        def new_forward(self, *args, **kwargs):
            return orig_forward(self, *args, **kwargs)
        return new_forward

    class Wrapped(type(wl.get_model())):
        @wrapped
        def forward(self, x):
            return torch.softmax(self.norm(x) * 2.0, dim=-1)

    scope, st = three_alike_calls(promoted, wl, Wrapped)
    assert Wrapped.forward.__code__.co_freevars == ("orig_forward",)
    assert scope.direct is not None and scope.direct.calls == 2 and scope.calls == 3, scope.direct_why
    assert st["served"] == 3


def _sig_plain(self, x, y=2): ...


def _sig_star(self, x, *rest, scale=1.0, **extra): ...


def _sig_kwonly(self, x, *, mask, bias=None): ...


def _sig_hf(self, hidden_states, position_embeddings, attention_mask=None, **kwargs): ...


@pytest.mark.parametrize("f", [_sig_plain, _sig_star, _sig_kwonly, _sig_hf], ids=lambda f: f.__name__)
@pytest.mark.parametrize("args, kwargs", [
    ((1,), {}), ((1, 3), {}), ((1, 3, 4), {}), ((), {"x": 1}), ((1,), {"y": 5}), ((1,), {"x": 2}),
    ((1,), {"mask": 0}), ((1, 2), {"scale": 3.0, "other": 4}), ((1, 2), {"attention_mask": 3, "cache": 4}),
    ((1,), {"position_embeddings": 2, "self": 0}), ((), {}),
])
def test_a_direct_call_binds_its_frame_as_python_does(f, args, kwargs):
    """The frame Dynamo's guards are checked against is the one Python would bind (the guards read
    its locals by name): every parameter kind, and None wherever Python raises."""
    import inspect

    from forge_tui.runtime.direct import DirectCall

    owner = object()
    code = f.__code__
    defaults = dict(zip(code.co_varnames[code.co_argcount - len(f.__defaults__ or ()):code.co_argcount],
                        f.__defaults__ or ()))
    defaults.update(f.__kwdefaults__ or {})
    d = DirectCall(f, lambda frame: True, owner, code, defaults, None, "cpu")
    try:
        bound = inspect.signature(f).bind(owner, *args, **kwargs)
    except TypeError:
        assert d.frame(args, kwargs) is None
        return
    bound.apply_defaults()
    assert d.frame(args, kwargs) == dict(bound.arguments)


def test_a_scope_whose_forward_takes_kwargs_is_called_directly(promoted, monkeypatch):
    """Hugging Face's layers take ``**kwargs``: their scopes run directly too, and a call whose
    keyword arguments Dynamo's guards refuse goes to Dynamo."""

    wl = load_workload()
    monkeypatch.setitem(sys.modules, wl.__name__, wl)

    class Keywords(type(wl.get_model())):
        def forward(self, x, *rest, **kwargs):
            h = self.norm(x)
            return torch.softmax(h * kwargs.get("scale", 1.0), dim=-1)

    model = Keywords()
    model.load_state_dict(wl.get_model().state_dict())
    x = wl.get_inputs()[0]
    with torch.no_grad():
        expected = [model(x, scale=2.0), model(x, scale=3.0)]

    def calls(m):
        return [m(x, scale=2.0), m(x, scale=2.0), m(x, scale=3.0)]

    outs, scope, st = scope_calls(promoted, model, calls)
    for o, e in zip(outs, [expected[0], expected[0], expected[1]]):
        torch.testing.assert_close(o, e)
    assert scope.direct is not None and scope.direct.calls == 1, scope.direct_why  # the scale baked in


def test_alike_scopes_share_what_their_compiles_found(tmp_path, monkeypatch):
    """A model's layers are alike scopes (one forward's code, the same card): they compile one copy
    of it together, so the profiled shape compiles once for all of them; a call at new shapes that
    compiled a variant serving nothing in the first layer compiles in no other layer, and calls at
    that shape again compile nowhere; the profiled shape is served in every layer, each layer's
    direct call running the shared variant on its own module."""
    from forge_tui.runtime import graph as graph_mod

    ws, card, wl = one_card_promoted(tmp_path, "softmax_layers.py", "aten._softmax.default",
                                      (CPU / "softmax_good.cpp").read_text())
    compiles = count_scope_compiles(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    steps = [torch.randn(n, 64) for n in (1, 1, 1)] + [torch.randn(16, 64)]
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for t in [x, x, *steps, x]:
            torch.testing.assert_close(model(t), ref(t))
        scopes = [applied.scopes[f"layers.{i}"] for i in range(2)]
        st = applied.status()["cards"][0]
        from forge_tui.e2e.scopes import scope_notes

        notes = scope_notes(applied)
    assert scopes[0].book is scopes[1].book and all(s.shared for s in scopes)
    assert any("layers.1" in n and "3 calls at shapes no served variant covers ran as written" in n for n in notes), notes
    assert all(any(f"layers.{i}" in n and "compiles no more variants" in n for n in notes) for i in range(2)), notes
    # one copy of the layers' code: the profiled shape compiled once for both, then the new shape
    # in the first layer only
    assert compiles == [id(scopes[0])] * 2, compiles
    assert [s.variants for s in scopes] == [2, 2] and [s.serving for s in scopes] == [[1], [1]]
    assert all(s.direct is not None and s.direct_variant == 1 for s in scopes)
    assert st["served"] == 2 * 4  # the profiled shape, four times in each layer
    assert [s.uncovered for s in scopes] == [2, 3]
    assert st["fallbacks"].get(graph_mod.GraphScope.UNCOVERED_WHY) == 2 + 3


def test_a_stopped_scope_serves_its_other_variants_without_compiling(tmp_path):
    """One layer called at two shapes in the profiled forward (a softmax card for each): its scope
    compiles a served variant for each, the direct call runs the first. Once a third shape stops
    its compiles, calls at the second shape are still served, through Dynamo's run-only path (the
    variants compiled, no compile), and the third shape runs as written, counted as uncovered
    without its key being worked out (its variant served nothing)."""
    from forge_tui.runtime.graph import GraphScope

    src = (HERE / "data" / "workloads" / "softmax_layers.py").read_text()
    body = """        for layer in self.layers:
            x = layer(x)
        return x
"""
    path = tmp_path / "wl.py"
    path.write_text(src.replace(body, "        return self.layers[0](x), self.layers[0](x[:8])\n"))
    ws, _, wl = one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
    others = [c for c in ws.cards() if c.target == "aten._softmax.default" and c.id not in manifest(ws).entries]
    assert len(others) == 1
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        r = ev.evaluate(others[0], (CPU / "softmax_good.cpp").read_text())
    assert r.correct, r.reason
    promote_kernel(ws, others[0].id, (CPU / "softmax_good.cpp").read_text(), r, by="test")
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    layer, ref_layer = model.layers[0], ref.layers[0]
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(2):
            torch.testing.assert_close(model(x), ref(x))
        scope = applied.scopes["layers.0"]
        assert scope.serving == [1, 2] and scope.stopped is None
        odd = torch.randn(3, 64)
        torch.testing.assert_close(layer(odd), ref_layer(odd))  # a third variant, serving nothing
        assert scope.variants == 3 and scope.stopped
        served = sum(c["served"] for c in applied.status()["cards"])
        keys: list[int] = []
        real_key = scope_mod.call_key

        def counting_key(*a):
            keys.append(1)
            return real_key(*a)

        scope_mod.call_key = counting_key
        try:
            for t in (x[:8], x[:8], odd, x):
                torch.testing.assert_close(layer(t), ref_layer(t))
                if t is odd:
                    assert keys == [1, 1] and scope.uncovered == 1  # the x[:8] calls' keys alone
        finally:
            scope_mod.call_key = real_key
        st = applied.status()["cards"]
        # a fourth shape, which no variant covers: the run-only path runs the forward as written
        # once, and a like call runs as written at once, both counted as uncovered
        new = torch.randn(5, 64)
        torch.testing.assert_close(layer(new), ref_layer(new))
        runs: list[int] = []
        run_only = scope._run_only

        def counted(*a, **k):
            runs.append(1)
            return run_only(*a, **k)

        scope._run_only = counted
        torch.testing.assert_close(layer(new), ref_layer(new))
        torch.testing.assert_close(layer(x[:8]), ref_layer(x[:8]))  # still served, through run-only
        st2 = applied.status()["cards"]
    assert sum(c["served"] for c in st) == served + 3  # both x[:8] calls and x; not the odd one
    assert all(c["fallbacks"].get(GraphScope.UNCOVERED_WHY) == 1 for c in st)  # the odd one
    assert scope.uncovered == 3 and runs == [1] and scope.direct.calls >= 2
    assert sum(c["served"] for c in st2) == served + 4
    assert sum(c["fallbacks"].get(GraphScope.UNCOVERED_WHY, 0) for c in st2) == 3 * len(st2)


def test_a_remembered_refusal_leaves_a_compiled_scopes_trace_alone(promoted):
    """A module card that refused a call's shape (remembered) and then runs inside a compiled
    scope's trace at that shape: the trace takes the card's traced path, so the scope compiles a
    variant for it and every call counts a fallback for each card; the remembered refusal's path
    traced instead hid the scope's softmax card from the count."""
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    odd = torch.randn(4, 256)
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        model(x)
        model(x)
        torch.testing.assert_close(model.norm(odd), ref.norm(odd))  # refused, remembered
        for _ in range(3):
            torch.testing.assert_close(model(odd), ref(odd))
        scope = applied.scopes[""]
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert scope.variants == 2 and scope.serving == [1]
    assert sum(st[sm.id]["fallbacks"].values()) == 3, st[sm.id]
    assert st[norm.id]["fallbacks"] == {"input 0: shape (4, 256)": 4}, st[norm.id]


def test_alike_scopes_stop_sharing_where_dynamo_guards_a_layer_of_its_own(tmp_path):
    """Where the shared copy compiles again for a call like one it compiled (Dynamo guards
    something of that layer's own: here an attribute the forward reads, set apart in one layer),
    the book stops sharing: that layer, from its next call, and the later layers compile copies
    of their own, so one cache never holds a variant a layer. Every layer is served and agrees
    with eager."""
    src = (HERE / "data" / "workloads" / "softmax_layers.py").read_text()
    src = src.replace("        self.proj = nn.Linear(64, 64)\n", "        self.proj = nn.Linear(64, 64)\n        self.t = 1.0\n")
    src = src.replace("return torch.softmax(self.proj(x), dim=-1)", "return torch.softmax(self.proj(x) * self.t, dim=-1)")
    src = src.replace("for _ in range(2))", "for _ in range(3))")
    path = tmp_path / "wl.py"
    path.write_text(src)
    ws, card, wl = one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    for m in (model, ref):
        m.layers[1].t = 0.5
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(3):
            torch.testing.assert_close(model(x), ref(x))
        scopes = [applied.scopes[f"layers.{i}"] for i in range(3)]
        st = applied.status()["cards"][0]
    book = scopes[0].book
    assert [s.shared for s in scopes] == [True, False, False] and not book.shared
    assert book.variants.codes and len(book.variants.codes) == 2  # layer 0's and layer 1's first
    assert scopes[1].variants == 1 and scopes[2].variants == 1 and st["served"] == 3 * 3


def test_a_call_by_keywords_leads_with_the_forwards_first_parameter():
    """A model's own forward called by keywords alone (a Hugging Face model's in ``generate``):
    its lead is the tensor of its first parameter (``input_ids``, one token at every decode step),
    not the attention mask, which sorts first by name and grows at every step. Read back from a
    profiled call's key text the same way; a forward without a readable signature keeps the
    order by name."""
    from forge_tui.runtime.graph import Leads, VariantBook, call_key, key_text

    def forward(input_ids, attention_mask=None, position_ids=None, **kwargs):
        return input_ids

    ids = torch.zeros(2, 1, dtype=torch.long)
    steps = [{"input_ids": ids, "attention_mask": torch.ones(2, 16 + k), "position_ids": ids} for k in range(3)]
    prompt = {"input_ids": torch.zeros(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16)}
    leads = Leads([key_text(call_key((), prompt))], forward)
    assert leads.profiled_leads == {((2, 16), torch.int64)}
    assert {leads.lead((), kw) for kw in steps} == {((2, 1), torch.int64)}  # one lead at every step
    leads.note(leads.lead((), steps[0]), served=False)
    assert all(leads.unlike(leads.lead((), kw)) for kw in steps[1:])
    assert not leads.unlike(leads.lead((), prompt))
    by_name = Leads([key_text(call_key((), prompt))])  # no signature: the mask, by name
    assert by_name.profiled_leads == {((2, 16), torch.float32)}
    assert len({by_name.lead((), kw) for kw in steps}) == 3  # a new lead at every step
    assert VariantBook([], lambda *a, **k: None).rank == {}  # (*args, **kwargs): by name
    # the lookup in the parameters' order answers as the rule does: a parameter passed as None,
    # tensors only in **kwargs (by name), positional tensors first
    from forge_tui.runtime.graph import call_lead

    odd = [{"input_ids": None, "position_ids": ids, "attention_mask": torch.ones(2, 3)},
           {"input_ids": None, "zeta": torch.ones(4), "alpha": torch.ones(5, dtype=torch.half)},
           {"attention_mask": 3, "cache": torch.ones(6)}]
    for kw in odd:
        assert leads.lead((), kw) == call_lead((), kw, leads.rank), kw
    assert leads.lead((), odd[0]) == ((2, 3), torch.float32)  # the mask: the first tensor parameter
    assert leads.lead((), odd[1]) == ((5,), torch.float16)  # then by name
    assert leads.lead((torch.ones(7),), steps[0]) == ((7,), torch.float32)
