"""Leaf modules whose forward is one served op: learned from their calls under the interceptor,
then called straight to the guard, with every check the interceptor's path makes."""

import importlib.util

import pytest
import torch
from runtime_helpers import (
    CPU,
    EPS,
    HERE,
    SHAPE_MISS,
    STRIDE_MISS,
    GlobalEps,
    PlusOne,
    count_intercepted,
    fake_clock,
    layer_norm_model,
    layer_norm_workspace,
    layernorm_workload,
    one_card_promoted,
    settle,
    square_workspace,
    with_gain,
)

from forge_tui.runtime import guard as guard_mod
from forge_tui.runtime import placement
from forge_tui.runtime.apply import Guard, apply
from forge_tui.runtime.kernel import CardKernel, KernelError


@pytest.fixture
def layer_norm_ws(tmp_path_factory):
    return layer_norm_workspace(tmp_path_factory)


@pytest.fixture
def square_ws(tmp_path_factory):
    return square_workspace(tmp_path_factory)


@pytest.mark.parametrize("eager_costly", [True, False])
@pytest.mark.parametrize("site", ["leaf", "interceptor"])
def test_an_op_cards_dispatch_is_weighed_against_eager_s_own_call(layer_norm_ws, monkeypatch, site, eager_costly):
    """An op card served at a learned leaf site, or through the interceptor (the leaf not
    learned), whose dispatch looks costlier than what the kernel saves is judged as a module card
    is: eager's own call (the leaf's forward, or the op) is timed in the kernel's place
    (EAGER_SAMPLES calls, counted as fallbacks) and the kernel stays where its whole call costs the
    host no more than eager's by what it saves. (On the H200 a group norm leaf was switched off for
    a 31 µs dispatch inside the forward, where eager's own call of the module cost it more.)"""
    from forge_tui.runtime.kernel import CardKernel

    ws, card = layer_norm_ws
    model, x = layer_norm_model()
    with torch.no_grad():
        expected = model(x)
    # the host's clock is a stand-in: each path costs what the test says, whatever the machine's load
    clock = fake_clock(monkeypatch)
    if site == "interceptor":
        monkeypatch.setattr(placement, "direct_leaf", lambda module: False)  # every call through the interceptor
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 1e-3))  # dispatch always looks too costly
    if eager_costly:  # eager's call costs the host 2 ms more where it is timed in the kernel's place
        real = Guard.time_eager

        def time_eager(self, call):
            return real(self, lambda: (clock.spend(0.002), call())[1])

        monkeypatch.setattr(Guard, "time_eager", time_eager)
    else:  # the kernel's call costs the host 2 ms more than eager's, on either path
        real_call, real_bind = CardKernel.__call__, CardKernel.bind

        def call(self, *a, **k):
            clock.spend(0.002)
            return real_call(self, *a, **k)

        def bind(self, keep):
            bound = real_bind(self, keep)

            def slow(inputs, t0=0):
                clock.spend(0.002)
                return bound(inputs, t0)

            return slow

        monkeypatch.setattr(CardKernel, "__call__", call)
        monkeypatch.setattr(CardKernel, "bind", bind)
    why = Guard.EAGER_WHY
    calls = 30
    with torch.no_grad(), apply(model, ws, trial_calls=0, compiled_scopes=False) as applied:
        for _ in range(calls):
            torch.testing.assert_close(model(x), expected)
        st = applied.status()["cards"][0]
        assert bool(applied.leaves) == (site == "leaf")
    assert st["card"] == card.id and st["fallbacks"].get(why) == Guard.EAGER_SAMPLES, st
    if eager_costly:
        assert st["active"] and st["eager_call_us"] >= 2000, st
        assert st["served"] == calls - Guard.EAGER_SAMPLES, st
    else:
        assert not st["active"] and "more than eager's own" in st["disabled_reason"], st


def test_a_leaf_module_whose_forward_is_one_served_op_is_called_without_the_interceptor(layer_norm_ws, monkeypatch):
    """nn.LayerNorm's forward is one op, served: after two calls under the interceptor, its calls
    go to the card's guard directly (nothing dispatched through the interceptor), and still agree
    with eager. A changed attribute (eps), gradients or autocast send the call back through the
    interceptor, which judges it as before."""
    wl = layernorm_workload()
    ws, card = layer_norm_ws
    seen = count_intercepted(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, only_faster=False) as applied:
            outs = [model(x) for _ in range(5)]
            assert seen == ["aten.native_layer_norm.default"] * 2  # the two calls it learned from
            assert applied.status()["cards"][0]["served"] == 5
            model.norm.eps = 1e-3  # not the call the card was profiled with: through the interceptor
            changed = model(x)
            assert len(seen) == 3 and applied.status()["cards"][0]["fallbacks"] == {"arguments differ": 1}
            model.norm.eps = 1e-5
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(x)
            assert len(seen) == 4
    for o in outs:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(changed, torch.nn.functional.layer_norm(x, (256,), model.norm.weight, model.norm.bias,
                                                                       1e-3))
    with apply(model, ws, only_faster=False) as applied:
        y = x.clone().requires_grad_()
        for _ in range(3):
            out = model(y)
        assert out.grad_fn is not None  # the learned path never serves a call that needs gradients
    assert "forward" not in model.norm.__dict__

    class Caching(torch.nn.LayerNorm):  # a forward with a side effect no dispatch mode sees
        forge_direct = True  # it says (wrongly) that it reads and writes nothing else

        def forward(self, x):
            self.last = super().forward(x)
            return self.last

    caching = Caching(256)
    caching.load_state_dict(model.norm.state_dict())
    model.norm = caching
    del seen[:]
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(4):
            out = model(x)
            assert caching.last is out  # never skipped: the attribute it rebinds keeps it from being learned
        assert len(seen) == 4 and applied.status()["cards"][0]["served"] == 4


def test_a_leaf_that_copies_its_input_before_its_served_op_is_learned(tmp_path, monkeypatch):
    """nn.GroupNorm handed a tensor laid out channels innermost copies it contiguous (aten.clone)
    and then calls its one op, the served group norm: the site is learned with the copy, later
    calls make the copy themselves and go to the guard without the interceptor, and agree with
    eager. The op's mean and rstd, which the module drops, are not allocated per call: the kernel
    writes them to buffers it keeps. An input that is contiguous already (eager copies nothing)
    is served the same way: ``contiguous()`` hands it back as it is."""
    ws, card, wl = one_card_promoted(tmp_path, "groupnorm_channels_last.py", "aten.native_group_norm.default")
    model, (x, attn) = wl.get_model(), wl.get_inputs()
    seen = count_intercepted(monkeypatch)
    with torch.no_grad():
        expected = model(x, attn)
        with apply(model, ws, only_faster=False, cards=[card.id]) as applied:
            outs = [model(x, attn) for _ in range(5)]
            # the two calls it learned from, each a copy and the served op; then none
            assert seen == ["aten.clone.default", "aten.native_group_norm.default"] * 2, seen
            assert applied.status()["cards"][0]["served"] == 5
            kernel = applied.guards[card.id].kernel()
            assert len(kernel._dead) == 2  # the mean and the rstd, kept
            dense = attn.transpose(1, 2).reshape(x.shape).contiguous() + x  # no copy in eager
            direct = model.norm(dense)
            assert len(seen) == 4 and applied.status()["cards"][0]["served"] == 6
            n = settle(applied, lambda: model(x, attn))  # the fast path: the copy, the kept outputs
            settled = [model(x, attn) for _ in range(3)]
            assert len(seen) == 4 and applied.status()["cards"][0]["served"] == 6 + n + 3
            assert len(kernel._dead) == 2
    for o in settled:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)
    for o in outs:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)
    assert not any(o is p for o in outs for p in kernel._dead.values())
    torch.testing.assert_close(direct, model.norm(dense), rtol=1e-5, atol=1e-5)


def test_only_forwards_that_read_nothing_else_are_learned(layer_norm_ws, monkeypatch):
    """A subclass that overrides nn.LayerNorm's forward may read what no attribute shows (here a
    global eps): it is never learned, and a changed global reaches PyTorch, not the card."""
    ws, _ = layer_norm_ws
    seen = count_intercepted(monkeypatch)
    model, x = layer_norm_model()
    norm = GlobalEps(256)
    norm.load_state_dict(model.norm.state_dict())
    model.norm = norm
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(3):
            model(x)
        assert len(seen) == 3 and applied.status()["cards"][0]["served"] == 3  # all through the interceptor
        EPS[0] = 1e-1
        try:
            out = model(x)
        finally:
            EPS[0] = 1e-5
        assert applied.status()["cards"][0]["fallbacks"] == {"arguments differ": 1}
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (256,), norm.weight, norm.bias, 1e-1))


def test_a_learned_call_with_the_same_tensor_twice_does_not_serve_two_tensors(square_ws, monkeypatch):
    """Learned from `m(x, x)` (the card squares its one input), the call `m(x, y)` is another call:
    it goes to the interceptor, which runs PyTorch's `x * y`."""
    spec = importlib.util.spec_from_file_location("leaf_mul", HERE / "data" / "workloads" / "leaf_mul.py")
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    seen = count_intercepted(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    y = torch.randn_like(x)
    with torch.no_grad(), apply(model, square_ws, only_faster=False) as applied:
        for _ in range(3):
            torch.testing.assert_close(model.m(x, x), x * x)
        assert len(seen) == 2  # learned
        out = model.m(x, y)
        st = applied.status()["cards"][0]
        assert st["served"] == 3 and st["fallbacks"] == {"2 tensors where the card has 1": 1}
    torch.testing.assert_close(out, x * y)


def test_a_learned_call_under_a_mode_or_transform_goes_through_pytorch(layer_norm_ws):
    """After it is learned, a call under a __torch_function__ mode, under vmap or with a forward-AD
    dual tensor is not served directly: each reaches PyTorch's dispatch, the result is what eager
    gives under the same mode or transform, and the kernel stays active (handed vmap's batched
    tensor, which has no storage, it would fail and be disabled)."""
    import torch.autograd.forward_ad as fwAD

    ws, _ = layer_norm_ws
    model, x = layer_norm_model()
    xs, tangent = torch.randn(4, 16, 256), torch.randn_like(x)
    with torch.no_grad():
        with PlusOne():
            ref_mode = model(x)
        ref_vmap = torch.vmap(model)(xs)
        with fwAD.dual_level():
            ref_tangent = fwAD.unpack_dual(model(fwAD.make_dual(x, tangent))).tangent
        with apply(model, ws, only_faster=False) as applied:
            for _ in range(3):
                model(x)
            served = applied.status()["cards"][0]["served"]
            with PlusOne():
                got_mode = model(x)
            got_vmap = torch.vmap(model)(xs)
            with fwAD.dual_level():
                got_tangent = fwAD.unpack_dual(model(fwAD.make_dual(x, tangent))).tangent
            st = applied.status()["cards"][0]
            assert st["served"] <= served + 2 and st["active"], st  # nothing disabled the kernel
    torch.testing.assert_close(got_mode, ref_mode)
    torch.testing.assert_close(got_vmap, ref_vmap)
    assert got_tangent is not None
    torch.testing.assert_close(got_tangent, ref_tangent)


def test_a_settled_learned_site_serves_through_its_fast_path_with_every_check(layer_norm_ws, monkeypatch):
    """Once its guard has timed its dispatch, a learned leaf's call takes the fast path
    (``_LeafSites._fast``): it serves the call, and each check of the general path still holds
    there, each one sending the call back to the general path, which judges it as before: a
    changed attribute, a replaced parameter, a parameter changed in place to another dtype,
    another shape, another layout, gradients, autocast, a __torch_function__ mode, vmap, forward
    AD, and a kernel that fails."""
    import torch.autograd.forward_ad as fwAD

    ws, _ = layer_norm_ws
    seen = count_intercepted(monkeypatch)
    model, x = layer_norm_model()
    norm = model.norm
    F = torch.nn.functional

    def eager(t, **kw):
        return F.layer_norm(t, (256,), kw.get("w", norm.weight), norm.bias, kw.get("eps", norm.eps))

    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        n = settle(applied, lambda: model(x))
        leaf, st = applied.leaves["norm"], lambda: applied.status()["cards"][0]
        fast_calls = []
        real_fast = leaf.fast

        def counting(args, kwargs):
            out = real_fast(args, kwargs)
            fast_calls.append(out is not guard_mod.NOT_SERVED and out is not guard_mod.FELL_BACK)
            return out

        leaf.fast = counting
        before = len(seen)
        for _ in range(3):
            torch.testing.assert_close(model(x), eager(x), rtol=1e-5, atol=1e-6)
        assert fast_calls == [True] * 3 and len(seen) == before and st()["served"] == n + 3

        def back(call, reason=None, served=False):
            """``call`` went the general way: the fast path declined, and counted ``reason``."""
            del fast_calls[:]
            fb = dict(st()["fallbacks"])
            out = call()
            assert fast_calls and not any(fast_calls), fast_calls
            if reason is not None:
                assert st()["fallbacks"].get(reason, 0) == fb.get(reason, 0) + 1, st()["fallbacks"]
            return out

        norm.eps = 1e-3
        torch.testing.assert_close(back(lambda: model(x), "arguments differ"), eager(x, eps=1e-3))
        norm.eps = 1e-5
        w = norm.weight
        norm.weight = torch.nn.Parameter(w * 2)  # another parameter: served (or not) by the general path
        torch.testing.assert_close(back(lambda: model(x)), eager(x), rtol=1e-5, atol=1e-6)
        norm.weight = w
        keep = w.data
        w.data = torch.stack([keep, keep], 1).reshape(-1)[::2]  # the same object and values, strided
        torch.testing.assert_close(back(lambda: model(x), STRIDE_MISS), eager(x), rtol=1e-5, atol=1e-6)
        w.data = keep
        wide = torch.randn(4, 256)
        torch.testing.assert_close(back(lambda: model(wide), SHAPE_MISS), eager(wide), rtol=1e-5, atol=1e-6)
        odd = torch.randn(16, 512)[:, ::2]
        torch.testing.assert_close(back(lambda: model(odd)), eager(odd), rtol=1e-5, atol=1e-6)
        with torch.enable_grad():
            y = x.clone().requires_grad_()
            assert back(lambda: model(y)).grad_fn is not None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            back(lambda: model(x))
        ref = eager(x)
        with PlusOne():
            torch.testing.assert_close(back(lambda: model(x)), ref + 1, rtol=1e-5, atol=1e-6)
        xs = torch.randn(4, 16, 256)
        del fast_calls[:]
        torch.testing.assert_close(torch.vmap(model)(xs), F.layer_norm(xs, (256,), norm.weight, norm.bias, 1e-5))
        assert not any(fast_calls)
        tangent = torch.randn_like(x)
        with fwAD.dual_level():
            assert fwAD.unpack_dual(back(lambda: model(fwAD.make_dual(x, tangent)))).tangent is not None
        assert st()["active"] and real_fast(((x,)), {}) is not guard_mod.NOT_SERVED
        del fast_calls[:]
        torch.testing.assert_close(model(x), eager(x), rtol=1e-5, atol=1e-6)
        assert fast_calls == [True]

        kernel = applied.guards[next(iter(applied.guards))].kernel()
        monkeypatch.setattr(kernel, "_launch", None)  # what bind specialised is not what fails: replace it
        broken = torch.nn.LayerNorm(256)
        broken.load_state_dict(norm.state_dict())

        def failing(*a, **k):
            raise KernelError("forge_launch returned 7")

        leaf_fast = leaf._fast
        leaf.fast, leaf._fast_tried = None, False
        monkeypatch.setattr(CardKernel, "bind", lambda self, keep: failing)
        model(x)  # the general path serves and builds the fast path again, on the failing launch
        assert leaf.fast is not None and leaf_fast is not None
        torch.testing.assert_close(model(x), eager(x), rtol=1e-5, atol=1e-6)
        s = st()
        assert not s["active"] and "kernel error: forge_launch returned 7" in s["disabled_reason"]
        assert s["fallbacks"].get("kernel error") == 1


def test_a_learned_site_checks_every_attribute_of_its_module():
    """The learned call's check of the module's attributes (one lookup of all the names): a plain
    value changed, an object rebound to an equal one, an attribute added or removed all fail it."""
    from forge_tui.runtime.attrs import attrs_check as _attrs_check
    from forge_tui.runtime.leaf import LeafSites as _LeafSites

    norm = torch.nn.LayerNorm(8)
    same = _attrs_check(_LeafSites(norm, "cpu")._attrs(), norm.__dict__)
    assert same(norm.__dict__)
    norm.eps = 1e-3
    assert not same(norm.__dict__)
    norm.eps = 1e-5
    assert same(norm.__dict__)
    hooks = norm._forward_hooks
    norm._forward_hooks = type(hooks)(hooks)  # equal, not the same object
    assert not same(norm.__dict__)
    norm._forward_hooks = hooks
    norm.extra = 1
    assert not same(norm.__dict__)
    del norm.extra
    del norm.__dict__["training"]
    assert not same(norm.__dict__)


def test_the_dispatch_cost_is_timed_on_learned_calls_of_every_leaf_module(tmp_path, monkeypatch):
    """One card served in three leaf modules: each module's first calls go through the
    interceptor while it learns the site, and none of those calls is counted in the dispatch
    cost; the samples come from the calls served directly, through the leaf's fast path (what
    every call after them costs: on the H200 machine the general path's cost switched the
    diffusion's layer norms off, whose fast path costs less than they save)."""
    from forge_tui.runtime.apply import OpGuard
    from forge_tui.runtime.leaf import LeafSites as _LeafSites

    ws, card, wl = one_card_promoted(tmp_path, "layernorms_shared.py", "aten.native_layer_norm.default",
                                      (CPU / "layernorm_twopass.cpp").read_text())
    assert len(card.module_paths) == 3
    model, x = wl.get_model(), wl.get_inputs()[0]
    calls: list[tuple[bool, bool]] = []  # (through the interceptor, counted)
    inside = [False]
    try_serve = OpGuard.try_serve

    def intercepted(self, *a, **k):  # what the interceptor calls for each op
        inside[0] = True
        try:
            return try_serve(self, *a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(OpGuard, "try_serve", intercepted)
    in_fast = [False]
    build = _LeafSites._fast

    def building(self, *a):
        fast = build(self, *a)

        def flagged(*args):
            in_fast[0] = True
            try:
                return fast(*args)
            finally:
                in_fast[0] = False

        return flagged

    monkeypatch.setattr(_LeafSites, "_fast", building)
    fast_counted = []
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        g = applied.guards[card.id]
        assert g.warmup == Guard.DISPATCH_WARMUP + 3 * _LeafSites.LEARN_CALLS
        real = g._account_dispatch

        def account(ns, call_ns=0):
            counted = g.timing() and g._warm_calls >= g.warmup
            calls.append((inside[0], counted))
            if counted:
                fast_counted.append(in_fast[0])
            real(ns, call_ns)

        g._account_dispatch = account
        for _ in range(8):
            model(x)
        assert g.status.dispatch_us is not None and g.status.active
    intercepted = [c for c in calls if c[0]]
    assert len(intercepted) == 3 * _LeafSites.LEARN_CALLS
    assert not any(counted for through, counted in calls if through)
    assert sum(counted for _, counted in calls) == Guard.DISPATCH_SAMPLES
    assert fast_counted == [True] * Guard.DISPATCH_SAMPLES


def test_a_leaf_call_refused_before_is_not_intercepted_again(layer_norm_ws, monkeypatch):
    """A leaf module called at shapes its card was not profiled at (a generation step, another
    resolution) went through the interceptor every call. Once learning is over, a call like one
    that no card served (the same tensors' specs, parameters, attributes, grad mode) counts the
    same refusals and runs the module's own forward, not intercepted; a changed attribute or
    parameter, or another shape, is judged through the interceptor again; the profiled shape is
    still served. Outputs agree with eager's every time."""
    from forge_tui.runtime.leaf import LeafSites as _LeafSites

    wl = layernorm_workload()
    ws, card = layer_norm_ws
    seen = count_intercepted(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model().norm
    odd = torch.randn(2, 1, 256)
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        for _ in range(3):
            torch.testing.assert_close(model(x), ref(x))
        for _ in range(_LeafSites.GIVE_UP):  # calls that teach nothing end the learning
            torch.testing.assert_close(model(odd), ref(odd))
        del seen[:]
        for _ in range(5):
            torch.testing.assert_close(model(odd), ref(odd))
        assert len(seen) == 1, seen  # the first of them intercepted; the rest remembered
        why = "input 0: shape (2, 1, 256)"
        assert st()["fallbacks"] == {why: _LeafSites.GIVE_UP + 5}, st()
        served = st()["served"]
        torch.testing.assert_close(model(x), ref(x))
        assert st()["served"] == served + 1
        del seen[:]
        model.norm.eps = ref.eps = 1e-3  # another attribute: judged again
        torch.testing.assert_close(model(odd), ref(odd))
        assert len(seen) == 1
        model.norm.weight = torch.nn.Parameter(model.norm.weight.clone())  # another parameter
        torch.testing.assert_close(model(odd), ref(odd))
        assert len(seen) == 2
        torch.testing.assert_close(model(odd[:1]), ref(odd[:1]))  # another shape
        assert len(seen) == 3
        assert st()["fallbacks"][why] == _LeafSites.GIVE_UP + 7
