"""Module cards served through their module's forward: the guard's checks, its fallbacks and
their reasons, kernel errors, shadow checks, the dispatch check, the specialised fast path and
remembered refusals."""

import shutil
from typing import Any

import pytest
import torch
from runtime_helpers import (
    count_checks,
    eager_output,
    fake_clock,
    installed_copy,
    load_workload,
    measured_speedups,
    one_card_promoted,
    promoted_workspace,
    with_gain,
)
from torch.overrides import TorchFunctionMode

from forge_tui.runtime import guard as guard_mod
from forge_tui.runtime import module_card
from forge_tui.runtime.apply import Guard, apply
from forge_tui.runtime.kernel import CardKernel, KernelError


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_the_model_uses_the_kernels_and_stays_correct(promoted):
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, only_faster=False) as applied:
            got = model(x)
            st = {c["card"]: c for c in applied.status()["cards"]}
        after = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert st[norm.id]["served"] == 1 and st[sm.id]["served"] == 1
    assert st[norm.id]["sites"] == ["norm"] and st[sm.id]["active"]
    # undone: the model is as it was
    assert "forward" not in model.norm.__dict__ and "forward" not in model.__dict__
    torch.testing.assert_close(after, expected)


def test_calls_that_do_not_match_run_pytorch_and_say_why(promoted):
    ws, norm, sm = promoted
    wl = load_workload()
    model = wl.get_model()
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for x in (torch.randn(8, 256), torch.randn(16, 256, dtype=torch.float64)):
            torch.testing.assert_close(model.double()(x) if x.dtype == torch.float64 else model.float()(x),
                                       eager_output(wl, x))
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[norm.id]["served"] == 0 and st[sm.id]["served"] == 0
    assert st[norm.id]["fallbacks"] == {"input 0: shape (8, 256)": 1, "input 0: dtype float64": 1}
    assert set(st[sm.id]["fallbacks"]) == {"input 0: shape (8, 256)", "input 0: dtype float64"}


def test_a_call_passed_differently_or_strided_differently_runs_pytorch(promoted):
    """The module card was profiled as norm(x) with a contiguous x: a keyword call, or an x with
    other strides, is not that call (the kernel assumes the recorded layout)."""
    ws, norm, _ = promoted
    wl = load_workload()
    model = wl.get_model()
    x = torch.randn(16, 256)
    xt = torch.randn(256, 16).t()  # the card's shape, column-major
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        torch.testing.assert_close(model.norm(x=x), wl.get_model().norm(x))
        torch.testing.assert_close(model.norm(xt), wl.get_model().norm(xt))
        model.norm(x)
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[norm.id]["fallbacks"] == {"non-tensor arguments differ from the profiled call": 1,
                                        "input 0: strides (1, 16)": 1}
    assert st[norm.id]["served"] == 1


def test_gradients_on_fall_back_to_pytorch(promoted):
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with apply(model, ws, only_faster=False) as applied:
        y = model(x)  # grad mode on, parameters need gradients: the module kernel has no backward
        y.sum().backward()
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert model.norm.weight.grad is not None
    assert st[norm.id]["fallbacks"] == {"gradients are on (kernels serve inference)": 1}


def test_a_kernel_error_disables_the_kernel_and_the_model_goes_on(promoted, monkeypatch):
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]

    def broken(self, inputs, timed=False, keep=-1):
        raise KernelError("forge_launch returned 7")

    monkeypatch.setattr(CardKernel, "__call__", broken)
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(3):
            torch.testing.assert_close(model(x), wl.get_model()(x))
        st = {c["card"]: c for c in applied.status()["cards"]}
    for cid in (norm.id, sm.id):
        assert not st[cid]["active"] and "kernel error: forge_launch returned 7" in st[cid]["disabled_reason"]
        assert st[cid]["served"] == 0
    assert st[norm.id]["fallbacks"] == {"kernel error": 1, "disabled": 2}
    # once every op card of a scope is off, the scope is no longer intercepted (its ops stop
    # passing through Python), so its later calls are not counted
    assert st[sm.id]["fallbacks"] == {"kernel error": 1}


def test_shadow_checks_disable_a_kernel_that_disagrees(promoted, monkeypatch):
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    real = CardKernel.__call__

    def off_by_a_bit(self, inputs, timed=False, keep=-1):
        return [o + 1e-2 for o in real(self, inputs, timed, keep)]

    monkeypatch.setattr(CardKernel, "__call__", off_by_a_bit)
    with torch.no_grad(), apply(model, ws, cards=[norm.id], shadow_every=2, only_faster=False) as applied:
        outs = [model(x) for _ in range(3)]
        st = applied.status()["cards"][0]
    assert st["served"] == 1 and st["shadow_checks"] == 1 and not st["active"]
    assert st["disabled_reason"].startswith("shadow check: output 0:")
    torch.testing.assert_close(outs[1], wl.get_model()(x))  # the checked call returned the reference


def test_kernels_that_do_not_pay_are_not_used(promoted, monkeypatch, tmp_path):
    """By default a kernel measured slower than eager is not installed, and one whose dispatch (the
    guard's own cost per call, measured on its first calls) eats what it saves is switched off:
    for a module card, where its call costs the host more than eager's own call of the module by
    what it saves. The kernels' speedups are recorded and the host's clock is a stand-in
    (``FakeClock``): what the guard decides follows from them, not from this machine's load."""

    ws, norm, sm = promoted
    ws = tmp_path / "ws"
    shutil.copytree(promoted[0].root, ws)
    measured_speedups(ws, {norm.id: 2.0, sm.id: 0.5})
    clock = fake_clock(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    init = Guard.__init__
    monkeypatch.setattr(Guard, "__init__", with_gain(init, 1e6))  # a call saves far more than dispatch costs
    with torch.no_grad(), apply(model, ws, trial_calls=0) as applied:  # the dispatch rule alone
        assert "slower than eager" in applied.skipped[sm.id]
        timed = Guard.DISPATCH_WARMUP + Guard.DISPATCH_SAMPLES  # the first calls are not counted
        for _ in range(timed - 1):
            model(x)
        assert applied.status()["cards"][0]["dispatch_us"] is None  # not decided before the last sample
        for _ in range(3):
            model(x)
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[norm.id]["active"] and st[norm.id]["dispatch_us"] > 0  # stated, and it pays
    assert st[norm.id]["served"] == timed + 2
    # a call saves next to nothing: eager's own call of the module is timed in the kernel's place
    # (EAGER_SAMPLES calls, counted as fallbacks), and the kernel stays only if its whole call
    # costs the host no more than eager's by what it saves
    monkeypatch.setattr(Guard, "__init__", with_gain(init, 1e-3))
    cls = type(model.norm)
    real = cls.forward
    expected = real(model.norm, x).detach()
    why = Guard.EAGER_WHY
    for eager_costly in (True, False):
        def forward(self, h, costly=eager_costly):
            if costly:  # eager's call costs the host 2 ms: the kernel's is far cheaper
                clock.spend(0.002)
                return real(self, h)
            return expected  # eager's call costs next to nothing: the kernel's is dearer
        monkeypatch.setattr(cls, "forward", forward)
        with torch.no_grad(), apply(model, ws, trial_calls=0) as applied:
            for _ in range(timed + Guard.EAGER_SAMPLES + 2):
                torch.testing.assert_close(model(x), wl.get_model()(x))
            st = {c["card"]: c for c in applied.status()["cards"]}[norm.id]
        if eager_costly:
            assert st["active"] and st["eager_call_us"] >= 2000, st
            assert st["served"] == timed + 2 and st["fallbacks"] == {why: Guard.EAGER_SAMPLES}
        else:
            assert not st["active"] and "more than eager's own" in st["disabled_reason"], st
            # the first call after the switch-off takes forge's forward out: the next is not counted
            assert st["served"] == timed and st["fallbacks"] == {why: Guard.EAGER_SAMPLES, "disabled": 1}


def test_a_kernels_first_calls_do_not_count_toward_its_dispatch_cost(promoted, monkeypatch, tmp_path):
    """The first served calls in a model (allocator growth, a leaf site still being learned) are
    slow once: they are timed but left out of the dispatch cost the guard weighs."""

    _, norm, _ = promoted
    ws = installed_copy(promoted[0], tmp_path / "ws", [norm.id])  # used whatever the fixture measured
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 50.0))  # a call saves 50 µs
    model = load_workload().get_model()
    with apply(model, ws, trial_calls=0) as applied:
        g = applied.guards[norm.id]
        assert Guard.DISPATCH_WARMUP >= 2
        for _ in range(Guard.DISPATCH_WARMUP):
            g._account_dispatch(400_000)  # 400 µs: the first calls
        assert g.status.active and g.status.dispatch_us is None
        for _ in range(Guard.DISPATCH_SAMPLES - 1):
            g._account_dispatch(20_000)
        assert g.status.dispatch_us is None and g.timing()  # one sample short
        g._account_dispatch(20_000)
        assert g.status.active and g.status.dispatch_us == 20.0  # the first calls left out
        assert not g.timing()


def test_a_module_card_whose_module_changed_an_attribute_runs_the_original_forward(promoted):
    """The kernel computes the module's forward as profiled: with an attribute other than the
    profile's (the RMSNorm's eps, training mode) the call runs the module's own forward, says which
    attribute differs, and agrees with eager; with the attribute back, the kernel serves again."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, only_faster=False, cards=[norm.id]) as applied:
        for _ in range(3):
            model.norm(x)
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        served = st()["served"]
        model.norm.variance_epsilon = 10.0
        changed = model.norm(x)
        eps_why = "its attribute variance_epsilon is 10.0 (the profile's: 1e-06)"
        assert st()["fallbacks"] == {eps_why: 1}
        model.norm.variance_epsilon = 1e-6
        training = model.norm.training
        model.norm.train(not training)
        model.norm(x)
        assert st()["fallbacks"] == {eps_why: 1, f"its attribute training is {not training} (the profile's: {training})": 1}
        model.norm.train(training)
        model.norm(x)
        assert st()["served"] == served + 1
    model.norm.variance_epsilon = 10.0
    torch.testing.assert_close(changed, model.norm(x))


def test_a_settled_module_card_is_served_through_its_fast_path(promoted, monkeypatch):
    """After its dispatch is timed the module card's calls take one specialised function
    (``apply._specialised``, the leaf sites' too); a changed attribute, a replaced parameter,
    gradients and another shape go the general way, which judges them as before, and every
    output agrees with the module's own."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model().norm
    served_fast: list[bool] = []
    build = module_card.specialised

    def counting(*a, **k):
        f = build(*a, **k)

        def call(args, kwargs):
            out = f(args, kwargs)
            served_fast.append(out is not guard_mod.NOT_SERVED and out is not guard_mod.FELL_BACK)
            return out

        return call

    monkeypatch.setattr(module_card, "specialised", counting)
    with torch.no_grad(), apply(model, ws, only_faster=False, cards=[norm.id]) as applied:
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        for _ in range(12):
            torch.testing.assert_close(model.norm(x), ref(x))
        assert served_fast and all(served_fast) and st()["served"] == 12 and st()["dispatch_us"] is not None
        n = len(served_fast)
        model.norm.variance_epsilon = 1e-2
        ref.variance_epsilon = 1e-2
        torch.testing.assert_close(model.norm(x), ref(x))
        assert served_fast[n:] == [False] and st()["fallbacks"] == {"its attribute variance_epsilon is 0.01 (the profile's: 1e-06)": 1}
        model.norm.variance_epsilon = ref.variance_epsilon = 1e-6
        w = model.norm.weight
        model.norm.weight = torch.nn.Parameter(w * 2)
        ref.weight = torch.nn.Parameter(ref.weight * 2)
        torch.testing.assert_close(model.norm(x), ref(x))  # the general path, the new weight
        assert served_fast[n + 1:] == [False] and st()["served"] == 13
        model.norm.weight, ref.weight = w, torch.nn.Parameter(ref.weight / 2)
        wide = torch.randn(4, 256)
        torch.testing.assert_close(model.norm(wide), ref(wide))
        with torch.enable_grad():
            y = x.clone().requires_grad_()
            assert model.norm(y).grad_fn is not None
        assert served_fast[n + 2:] == [False, False]
        torch.testing.assert_close(model.norm(x), ref(x))
        assert served_fast[-1] is True


def test_a_module_card_under_a_mode_runs_the_original_forward(promoted):
    """The RMSNorm module card's kernel would skip what a __torch_function__ mode does to the
    forward's ops: under a mode the original forward runs, and the fallback says why."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    seen: list[Any] = []

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        with Watching():
            out = model(x)
        st = {c["card"]: c for c in applied.status()["cards"]}[norm.id]
    assert st["served"] == 0 and st["fallbacks"] == {"a transform, mode or tensor subclass is active": 1}
    assert torch.rsqrt in seen  # the RMSNorm's own ops ran, under the mode
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))


def test_a_module_card_call_whose_tensors_were_refused_runs_the_original_at_once(promoted, monkeypatch):
    """A module card's call at shapes the card refuses is remembered by its tensors' specs: a like
    call counts the same reason and runs the original forward without the checks. A refusal caused
    by the module's own parameter is not remembered: once the parameter is back, it serves."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model().norm
    checks = count_checks(monkeypatch)
    odd = torch.randn(2, 1, 256)
    with torch.no_grad(), apply(model, ws, only_faster=False, cards=[norm.id]) as applied:
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        for _ in range(12):
            torch.testing.assert_close(model.norm(x), ref(x))
        del checks[:]
        for _ in range(4):
            torch.testing.assert_close(model.norm(odd), ref(odd))
        assert len(checks) == 1 and st()["fallbacks"] == {"input 0: shape (2, 1, 256)": 4}, st()
        # that shape in other strides: refused whatever its strides, without a check
        odd_t = torch.randn(256, 1, 2).permute(2, 1, 0)
        torch.testing.assert_close(model.norm(odd_t), ref(odd_t))
        assert len(checks) == 1 and st()["fallbacks"] == {"input 0: shape (2, 1, 256)": 5}, st()
        # the card's shape in other strides: checked once, then remembered by the strides too
        for _ in range(2):
            xs = torch.randn(256, 16).t()
            torch.testing.assert_close(model.norm(xs), ref(xs))
        assert len(checks) == 2 and st()["fallbacks"]["input 0: strides (1, 16)"] == 2, st()
        torch.testing.assert_close(model.norm(x), ref(x))
        assert st()["served"] == 13
        w = model.norm.weight
        model.norm.weight = torch.nn.Parameter(w.double())
        ref.weight = torch.nn.Parameter(ref.weight.double())
        for _ in range(2):
            model.norm(x)
        assert len(checks) == 4 and sum(n for k, n in st()["fallbacks"].items() if k.startswith("input 1")) == 2, st()
        model.norm.weight = w
        ref.weight = torch.nn.Parameter(ref.weight.float())
        torch.testing.assert_close(model.norm(x), ref(x))
        assert st()["served"] == 14


def test_a_refused_call_with_a_keyword_tensor_runs_the_original_at_once(tmp_path, monkeypatch):
    """A module card profiled as ``norm(x, gain=g)``: a call whose first tensor has another shape
    is refused whatever its keyword tensor is; a like call (same first tensor's shape, dtype and
    device, as many arguments) counts the same reason and runs the module's own forward, keyword
    included, without the checks. A call at the card's shapes is served."""
    ws, card, wl = one_card_promoted(tmp_path, "kwarg_norm.py", "module:GainNorm")
    model, (x, g) = wl.get_model(), wl.get_inputs()
    ref = wl.get_model().norm
    checks = count_checks(monkeypatch)
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        for _ in range(3):
            torch.testing.assert_close(model.norm(x, gain=g), ref(x, gain=g))
        assert st()["served"] == 3
        del checks[:]
        for n in (2, 2, 2):
            a, b = torch.randn(n, 256), torch.rand(n, 256) + 0.5
            torch.testing.assert_close(model.norm(a, gain=b), ref(a, gain=b))
        assert len(checks) == 1 and st()["fallbacks"] == {"input 0: shape (2, 256)": 3}, st()
        torch.testing.assert_close(model.norm(x, gain=g), ref(x, gain=g))
        assert st()["served"] == 4
