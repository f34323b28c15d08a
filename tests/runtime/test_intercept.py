"""Op cards served through the interceptor: a scope's own calls, nested scopes, the op's match of
its tensors and arguments, and a call like one that served nothing run as written."""

from types import SimpleNamespace

import pytest
import torch
from runtime_helpers import (
    count_intercepted,
    count_trials,
    edited_copy,
    installed_copy,
    load_workload,
    promoted_workspace,
    with_gain,
)

from forge_tui.runtime import intercept
from forge_tui.runtime.apply import Guard, apply, called_children


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_an_op_card_scope_intercepts_its_own_calls_not_its_childrens(promoted, monkeypatch):
    """The softmax is called in the top module's own forward: its card records that module as its
    scope ("direct"), and the runtime intercepts the top module's own ops only; the RMSNorm child
    runs outside the interception (a decoder layer's `add` must not send the whole attention and
    MLP through Python). The count of ops the interceptor sees is the behaviour under test."""
    ws, norm, sm = promoted
    assert "direct" in sm.flags and sm.module_paths == [""], (sm.flags, sm.module_paths)
    seen = count_intercepted(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, cards=[sm.id], only_faster=False, compiled_scopes=False) as applied:
            got = model(x)
            st = {c["card"]: c for c in applied.status()["cards"]}
    torch.testing.assert_close(got, expected)
    assert st[sm.id]["served"] == 1
    assert seen == ["aten._softmax.default"], seen  # none of the norm's pow, mean, rsqrt, mul ...
    assert "forward" not in model.norm.__dict__  # undone


def test_nested_scopes_each_intercept_their_own_calls(tmp_path):
    """A scope inside a scope: the inner module's own op is served under the inner scope, the outer
    module's under the outer, and neither sees the other's (the child wrapper leaves the outer
    interception before the inner one starts)."""

    class Inner(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Inner(), Inner()])

        def forward(self, x):
            for b in self.blocks:
                x = b(x) + 1
            return x

    model = Outer()
    children = called_children(model)
    assert children == list(model.blocks)  # the ModuleList is a container: its items are called
    seen: dict[int, list[str]] = {}

    class Mode(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self, table, owner=None, chains=None):
            super().__init__()
            self.forge_owner = owner
            self.runs = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.setdefault(id(self.forge_owner), []).append(str(func).split(".")[1])
            return func(*args, **(kwargs or {}))

    outer_owner, inner_owner = object(), object()
    for m, owner in ((model, outer_owner), (model.blocks[0], inner_owner)):
        table = {"any": [SimpleNamespace(guard=SimpleNamespace(status=SimpleNamespace(active=True),
                                                               sig=SimpleNamespace(scope_keys=[])))]}
        m.forward = intercept.intercepting(m.forward, Mode, table, None, owner)
    for child in children:
        child.forward = intercept.outside_scope(child.forward, outer_owner)
    x = torch.randn(4)
    with torch.no_grad():
        model(x)
    assert seen[id(outer_owner)] == ["add", "add"], seen
    assert seen[id(inner_owner)] == ["tanh", "mul"], seen


def test_an_op_card_call_checks_its_tensors_once(promoted, monkeypatch):
    """The op guard matches the call's tensors against the card, then serves them without a second
    check (the hot path of every op card call)."""

    ws, norm, sm = promoted
    calls = []
    real = Guard.mismatch

    def counting(self, tensors):
        calls.append(self.entry.card)
        return real(self, tensors)

    monkeypatch.setattr(Guard, "mismatch", counting)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False, compiled_scopes=False) as applied:
        model(x)
        st = {c["card"]: c for c in applied.status()["cards"]}
        # a call the card does not match is still checked, and falls back with the reason
        model(torch.randn(8, 256))
        st2 = {c["card"]: c for c in applied.status()["cards"]}
    assert st[sm.id]["served"] == 1 and calls[:1] == [sm.id] and len(calls) == 2, calls
    assert st2[sm.id]["served"] == 1 and sum(st2[sm.id]["fallbacks"].values()) == 1, st2[sm.id]


def test_a_workspace_profiled_before_direct_scopes_keeps_its_children_intercepted(promoted, tmp_path, monkeypatch):
    """Cards without the "direct" flag were captured with the whole subtree as their scope: the
    runtime keeps intercepting the children for them (the norm's ops pass the interceptor)."""
    src, norm, sm = promoted
    ws = edited_copy(src, tmp_path, sm.id, flags=[f for f in sm.flags if f != "direct"])
    seen = count_intercepted(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False):
        model(x)
    assert "aten._softmax.default" in seen and any("rsqrt" in s for s in seen), seen


def test_an_op_calls_fast_match_never_accepts_what_the_encoding_refuses():
    """Op cards with plain arguments match a call without encoding it; over random profiled
    calls and calls, that match accepts exactly the calls the encoding accepts (with the same
    distinct tensors) among plain values, and never one it refuses."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from forge_tui.program import encode
    from forge_tui.runtime.opmatch import OpGuard
    from forge_tui.runtime.opmatch import flat_pattern as _flat_pattern

    a, b = torch.zeros(2), torch.ones(2)
    pool = [a, b, -1, 0, 1, 2, True, False, None, 1.0, 0.5, float("nan"), float("inf"), "mean", [0, 1], (0, 1),
            [1.0, True], torch.Size([0, 1]), np.int64(1), torch.float32, [a], (0, 1, 2)]
    value = st.one_of(st.sampled_from([a, b]), st.sampled_from(range(len(pool))).map(lambda i: pool[i]))

    def encoded(args, kwargs):
        uniq, index = [], {}

        def ref(t):
            if id(t) not in index:
                index[id(t)] = len(uniq)
                uniq.append(t)
            return {"$in": index[id(t)]}

        return encode(list(args), ref), encode(dict(kwargs), ref), uniq

    seen = {"fast": 0}

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.lists(value, max_size=4), st.dictionaries(st.sampled_from(["dim", "keepdim"]), value, max_size=2),
           st.data())
    def check(prof_args, prof_kwargs, data):
        # the call: the profiled one with some values swapped (a tensor for the other one, often)
        swap = value
        args = [data.draw(swap) if data.draw(st.booleans()) else v for v in prof_args]
        if data.draw(st.booleans()):
            args = data.draw(st.lists(swap, max_size=4))
        kwargs = {k: data.draw(swap) if data.draw(st.booleans()) else v for k, v in prof_kwargs.items()}
        try:
            rec_args, rec_kwargs, _ = encoded(prof_args, prof_kwargs)
        except Exception:  # noqa: BLE001 - not a call a card records
            return
        flat = _flat_pattern(rec_args, rec_kwargs)
        if flat is None:
            return
        og = OpGuard.__new__(OpGuard)
        og.args, og.kwargs, og._flat = rec_args, rec_kwargs, flat
        fast = og._match_flat(args, kwargs)
        try:
            enc_args, enc_kwargs, uniq = encoded(args, kwargs)
            accepted = (enc_args, enc_kwargs) == (rec_args, rec_kwargs)
        except Exception:  # noqa: BLE001 - unencodable: refused
            accepted = False
        if fast is not None:
            seen["fast"] += 1
            assert accepted and len(fast) == len(uniq) and all(x is y for x, y in zip(fast, uniq))
        elif accepted:  # refused by the fast match: only for values it leaves to the encoding
            plain = (type(None), bool, int, float, str)
            assert not all(type(v) in plain or isinstance(v, torch.Tensor)
                           or (type(v) in (list, tuple) and all(type(x) in plain for x in v))
                           for v in [*args, *kwargs.values()])

    check()
    assert seen["fast"] > 20  # the fast match did serve calls


def test_an_intercepted_scope_runs_a_call_like_one_that_served_nothing_as_written(promoted, monkeypatch, tmp_path):
    """An intercepted scope (the softmax's, the model) called at a shape its cards were not
    profiled at: the first such call passes the interceptor and serves nothing; a like call (the
    same first tensor's shape and dtype: a decode step after the first) runs as written, its ops
    never intercepted, counted as a fallback of each card; the profiled shape is served still. The
    trial times only calls the kernels can serve."""
    from forge_tui.runtime.apply import UNSERVED_WHY, Trial

    ws, norm, sm = promoted
    root = installed_copy(ws, tmp_path / "ws", [sm.id])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 1e6))
    tried = count_trials(monkeypatch)
    monkeypatch.setattr(Trial, "time_call", lambda self, fn, k: (fn(), 10_000 if k else 30_000))  # kept
    seen = count_intercepted(monkeypatch)
    step = torch.randn(3, 256)  # another shape than the profiled (16, 256)
    with torch.no_grad(), apply(model, root, cards=[sm.id], compiled_scopes=False, trial_calls=2) as applied:
        assert sm.id in applied.guards and not applied.scopes, applied.skipped
        torch.testing.assert_close(model(step), wl.get_model()(step))  # intercepted (a trial call)
        first = len(seen)
        assert "aten._softmax.default" in seen and len(tried) == 1
        for _ in range(3):  # like the first: as written, no trial call
            torch.testing.assert_close(model(step), wl.get_model()(step))
        assert len(seen) == first and len(tried) == 1
        st = {c["card"]: c for c in applied.status()["cards"]}[sm.id]
        assert st["fallbacks"].get(UNSERVED_WHY) == 3 and st["served"] == 0, st
        for _ in range(6):  # the profiled shape: intercepted and served, tried (the first call of
            # each side its warm-up, the step's the kernel side's), then served
            torch.testing.assert_close(model(x), wl.get_model()(x), rtol=1e-5, atol=1e-6)
        st = {c["card"]: c for c in applied.status()["cards"]}[sm.id]
        assert st["active"] and st["trial"]["kept"], st
        assert st["served"] == 3 and len(seen) > first and len(tried) == 6, (st, len(tried))
