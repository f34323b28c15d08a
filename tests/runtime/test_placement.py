"""Where ``apply`` serves each card: which scopes compile and which are intercepted, what is
skipped and why, the in-place trials that keep a kernel only where it was faster, and the
forwards taken out once every card they serve is off."""

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
from runtime_helpers import (
    CPU,
    HERE,
    WORKLOAD,
    count_intercepted,
    count_trials,
    edited_copy,
    installed_copy,
    load_workload,
    measured_speedups,
    norm_and_softmax_promoted,
    one_card_promoted,
    promoted_workspace,
    with_gain,
)

from forge_tui.runtime import placement
from forge_tui.runtime.apply import Guard, Mode, apply
from forge_tui.workspace import profile_into_workspace


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_nothing_promoted_means_nothing_intercepted(tmp_path):
    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\n")
    ws, _ = profile_into_workspace(WORKLOAD, tmp_path / "ws", device="cpu", config_path=cfg)
    (ws.root / "kernels").mkdir()
    (ws.root / "kernels" / "manifest.json").write_text(json.dumps({"version": 1, "entries": {}, "rejected": []}))
    model = load_workload().get_model()
    with apply(model, ws, only_faster=False) as applied:
        assert not applied.guards and "forward" not in model.__dict__
        assert all("forward" not in m.__dict__ for m in model.modules())


def test_each_mode_takes_its_own_verdict(promoted, tmp_path):
    """A kernel switched off op by op (the host's cost of each call outweighed it) still serves
    compiled models and graphs; switched off under torch.compile, it still serves eager models."""
    import shutil

    ws, norm, _ = promoted
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][norm.id].update(enabled=False, disabled_reason="the forward ran slower with it")
    path.write_text(json.dumps(data))
    model = load_workload().get_model()
    with apply(model, root, only_faster=False) as applied:
        assert norm.id not in applied.guards and "slower with it" in applied.skipped[norm.id]
    for mode in (Mode.TORCH_COMPILE, Mode.CUDA_GRAPH):
        with apply(model, root, mode=mode, only_faster=False) as applied:
            assert norm.id in applied.guards, (mode, applied.skipped)
    data["entries"][norm.id].update(enabled=True, disabled_reason="", compile_disabled_reason="slower compiled")
    path.write_text(json.dumps(data))
    with apply(model, root, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
        assert norm.id not in applied.guards and "slower compiled" in applied.skipped[norm.id]
    with apply(model, root, only_faster=False) as applied:
        assert norm.id in applied.guards


@pytest.mark.parametrize("kernel_faster", [True, False])
def test_each_kernel_is_tried_in_place_and_kept_only_if_faster_there(promoted, monkeypatch, tmp_path, kernel_faster):
    """The first calls of a module card alternate the kernel's path and PyTorch's, timed; the
    kernel stays only if its median was lower. Op cards: their scope with and without the
    interceptor. The timer is a stand-in (the test must not depend on this machine's load): it
    gives each path a fixed time, and the kernels' speedups are recorded: the module card's faster
    than eager, the softmax's slower."""
    from forge_tui.runtime.apply import TAKEN_OUT, Trial

    _, norm, sm = promoted
    ws = installed_copy(promoted[0], tmp_path / "ws", [])
    measured_speedups(ws, {norm.id: 2.0, sm.id: 0.5})
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    fast, slow = (10_000, 50_000) if kernel_faster else (50_000, 10_000)
    # a call saves far more than its dispatch costs: the dispatch rule (real timings) stays out of it
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 1e6))

    def fake_time(self, fn, with_kernel):
        return fn(), fast if with_kernel else slow

    monkeypatch.setattr(Trial, "time_call", fake_time)
    with torch.no_grad(), apply(model, ws, trial_calls=3) as applied:
        # the softmax card measured slower than eager: not installed, the model's forward is left alone
        assert sm.id in applied.skipped
        outs = [model(x) for _ in range(10)]
        st = {c["card"]: c for c in applied.status()["cards"]}
        taken_out, own = list(applied.taken_out), "forward" in model.norm.__dict__
    assert "forward" not in model.norm.__dict__  # undone either way
    for out in outs:  # either path: eager's result
        torch.testing.assert_close(out, wl.get_model()(x), rtol=1e-5, atol=1e-6)
    t = st[norm.id]["trial"]
    assert t["calls"] == 3 and t["kept"] is kernel_faster
    assert (t["with_us"], t["without_us"]) == ((10.0, 50.0) if kernel_faster else (50.0, 10.0))
    # 1 + 3 calls each way decide; then the kernel serves every call, or none
    if kernel_faster:
        assert st[norm.id]["active"] and st[norm.id]["served"] == 4 + 2
        assert own and taken_out == []
    else:
        assert not st[norm.id]["active"] and "slower in place" in st[norm.id]["disabled_reason"]
        # the first call after the switch-off put the module's own forward back: the next call
        # never reached forge (nothing counted)
        assert st[norm.id]["served"] == 4 and st[norm.id]["fallbacks"] == {"disabled": 1}
        assert not own and taken_out == ["norm"]
        assert st[norm.id]["sites"] == [f"norm: {TAKEN_OUT}"]
    with torch.no_grad(), apply(model, ws, trial_calls=3, only_faster=False) as applied:
        model(x)
        assert applied.status()["cards"][0]["trial"] is None  # only_faster=False: no trial


def test_a_card_off_for_good_under_an_intercepted_scope_is_taken_out_too(promoted):
    """The RMSNorm is a child of the model, whose softmax card intercepts its forward: the norm's
    forward is the scope's wrapper (it leaves the interception) over forge's. Its card off for
    good, the wrapper calls the module's own forward from the next call; the scope's own
    take-out and undo then leave the module as it was."""
    from forge_tui.runtime.apply import TAKEN_OUT

    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    want = wl.get_model()(x)
    with torch.no_grad(), apply(model, ws, trial_calls=0, only_faster=False, compiled_scopes=False) as applied:
        assert {norm.id, sm.id} <= set(applied.guards), applied.skipped
        wrapper = model.norm.__dict__["forward"]
        assert wrapper.__qualname__.startswith("outside_scope.")  # the scope's, over forge's
        model(x)
        applied.board.disable(applied.guards[norm.id].status, "a test switched it off")
        for _ in range(3):
            torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-6)
        st = {c["card"]: c for c in applied.status()["cards"]}
        assert applied.taken_out == ["norm"] and st[norm.id]["fallbacks"] == {"disabled": 1}
        assert st[norm.id]["sites"] == [f"norm: {TAKEN_OUT}"]
        assert model.norm.__dict__["forward"] is wrapper  # still leaving the scope's interception
        applied.board.disable(applied.guards[sm.id].status, "a test switched it off")
        model(x)
        assert applied.taken_out == ["norm", "the model", "norm"]  # then the scope's wrapper on it
        assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []
    with torch.no_grad(), apply(model, ws, trial_calls=0, only_faster=False, compiled_scopes=False) as applied:
        applied.board.disable(applied.guards[norm.id].status, "a test switched it off")
        model(x)
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []  # undone after a take-out
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-6)


def test_an_op_card_scope_is_tried_with_and_without_the_interceptor(promoted, monkeypatch, tmp_path):
    """A scope whose ops all pass through Python while intercepted: kept only if faster so."""
    from forge_tui.runtime.apply import TAKEN_OUT, Trial

    ws, norm, sm = promoted
    root = installed_copy(ws, tmp_path / "ws", [sm.id])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    monkeypatch.setattr(Trial, "time_call", lambda self, fn, k: (fn(), 90_000 if k else 30_000))
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 1e6))
    for compiled in (False, True):
        with torch.no_grad(), apply(model, root, cards=[sm.id], trial_calls=2, compiled_scopes=compiled) as applied:
            assert sm.id in applied.guards, applied.skipped
            replaced = [n for n, m in model.named_modules() if "forward" in m.__dict__]
            assert "" in replaced and (compiled or len(replaced) > 1), replaced  # intercepted: its children too
            for _ in range(8):
                torch.testing.assert_close(model(x), wl.get_model()(x), rtol=1e-5, atol=1e-6)
            st = {c["card"]: c for c in applied.status()["cards"]}
            # the scope off for good: the first call after took forge's forwards out, the scope's
            # and (intercepted) its children's, which ran outside its interception
            assert applied.taken_out[0] == "the model"
            assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []
            assert all(site.endswith(TAKEN_OUT) for site in st[sm.id]["sites"]), st[sm.id]["sites"]
    t = st[sm.id]["trial"]
    assert t == {"with_us": 90.0, "without_us": 30.0, "calls": 2, "kept": False, "scope": "the model"}
    assert not st[sm.id]["active"] and "with its ops intercepted" in st[sm.id]["disabled_reason"]
    # served on the call that compiled the scope (untried: no variant had served yet) and on its
    # trial calls, then the model is not intercepted
    assert st[sm.id]["served"] == 4


@pytest.mark.parametrize("workload,children", [("runtime_model.py", 1), ("runtime_two_norms.py", 2)])
def test_a_scope_with_served_children_is_compiled_around_them(tmp_path, monkeypatch, workload, children):
    """The softmax's scope (the model) calls one RMSNorm, or two (one module card), served too:
    the scope is compiled all the same, each RMSNorm's card its custom op in the scope's one graph
    (``IN_GRAPH``), and no op passes the interceptor. Without that, each RMSNorm call is a graph
    break that its module card serves, and a scope with more such children than GRAPH_BREAKS is
    intercepted (the moe's attention, with its q and k norms, ran intercepted at 635-862 µs of
    host a call more than eager on the H200 while one was the limit)."""
    path = HERE / "data" / "workloads" / workload
    ws, norm, sm = norm_and_softmax_promoted(path, tmp_path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    seen = count_intercepted(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        for in_graph, graphs in ((True, 1), (False, children)):  # a graph after each break
            monkeypatch.setattr(placement, "IN_GRAPH", in_graph)
            with apply(model, ws, only_faster=False, trial_calls=0) as applied:
                got = [model(x) for _ in range(3)]
                st = {c["card"]: c for c in applied.status()["cards"]}
                scope = applied.scopes[""]
                assert list(applied.scopes) == [""] and scope.sites == {sm.id: 1}
                assert scope.failed is None and len(scope.levels) == graphs, scope.levels
                assert scope.direct is not None and scope.direct.calls == 2, scope.direct_why
                # a module card switched off inside a compiled scope keeps forge's forward, which
                # the scope's compile traced or guarded (taken out, the scope would compile again)
                norms = [m for m in model.modules() if type(m).__name__ == "RMSNorm"]
                applied.board.disable(applied.guards[norm.id].status, "switched off by the test")
                torch.testing.assert_close(model(x), expected)
                other = x[:5].clone()  # a shape the cards do not serve: its variant serves nothing,
                for _ in range(2):  # and the scope then runs such a call as written
                    torch.testing.assert_close(model(other), expected[:5])  # row by row
                torch.testing.assert_close(model(x), expected)
                assert scope.uncovered >= 1, scope.stopped
                assert applied.taken_out == [] and all("forward" in m.__dict__ for m in norms), applied.taken_out
            assert not any("forward" in m.__dict__ for m in model.modules())  # undone
            for g in got:
                torch.testing.assert_close(g, expected)
            assert st[sm.id]["served"] == 3 and st[norm.id]["served"] == 3 * children and seen == []
        monkeypatch.setattr(placement, "GRAPH_BREAKS", children - 1)
        with apply(model, ws, only_faster=False, trial_calls=0) as applied:
            again = model(x)
            assert not applied.scopes and "aten._softmax.default" in seen
        torch.testing.assert_close(again, expected)


def test_an_op_card_scope_missing_from_the_model_is_skipped_not_fatal(promoted, tmp_path):
    """A workspace profiled on a deeper model names scopes this one lacks: those are skipped, the
    card serves where its scopes exist, and a card with none of them says so."""
    src, norm, sm = promoted
    ws = edited_copy(src, tmp_path, sm.id, module_paths=["layers.31", ""])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False) as applied:
        model(x)
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[sm.id]["served"] == 1 and st[sm.id]["sites"] == ["ops under the model (compiled)"]
    ws2 = edited_copy(src, tmp_path / "b", sm.id, module_paths=["layers.31"])
    with apply(model, ws2, cards=[sm.id], only_faster=False) as applied:
        assert sm.id not in applied.guards and "none of its modules" in applied.skipped[sm.id]


def test_apply_that_fails_part_way_leaves_the_model_as_it_was(promoted, monkeypatch):
    """The module card is installed before the op card's scope; a failure there undoes it."""
    ws, norm, sm = promoted

    def broken():
        raise RuntimeError("no dispatch modes here")

    monkeypatch.setattr(placement, "interceptor_class", broken)
    model = load_workload().get_model()
    with pytest.raises(RuntimeError, match="no dispatch modes"):
        apply(model, ws, only_faster=False)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_scopes_serving_the_same_cards_share_one_trial():
    """The decoder's `add` in each layer: one trial pools their calls (one noisy layer must not
    switch the card off everywhere); scopes serving other cards have their own."""

    from forge_tui.runtime.placement import scope_trial as _scope_trial

    def og(card):
        return SimpleNamespace(guard=SimpleNamespace(entry=SimpleNamespace(card=card)))

    add, clone = og("add"), og("clone")
    trials: dict = {}
    t0 = _scope_trial(trials, [add], "layers.0", 6, "cpu")
    t1 = _scope_trial(trials, [add], "layers.1", 6, "cpu")
    t2 = _scope_trial(trials, [add, clone], "layers.0.self_attn", 6, "cpu")
    assert t0 is t1 and t2 is not t0 and len(trials) == 2
    assert _scope_trial(trials, [add], "layers.2", 0, "cpu") is None


@pytest.mark.parametrize("loop", [True, False])
def test_a_scope_whose_forward_loops_over_served_children_is_not_compiled(tmp_path, loop):
    """Dynamo cannot break a graph inside a loop: a forward that calls, in a loop, children forge
    serves outside its graph (here each layer, a scope of its own) has its whole frame skipped, and
    every frame below it compiled instead. Such a scope is intercepted, not compiled; the same
    forward unrolled compiles. The model's own softmax is served either way."""
    src = (HERE / "data" / "workloads" / "softmax_layers.py").read_text()
    body = """        for layer in self.layers:
            x = layer(x)
        return x
"""
    assert body in src
    new = ("        for layer in self.layers:\n            x = layer(x)\n" if loop else
           "        x = self.layers[0](x)\n        x = self.layers[1](x)\n") + "        return torch.softmax(x * 2, dim=-1)\n"
    path = tmp_path / "wl.py"
    path.write_text(src.replace(body, new))
    ws, card, wl = one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for _ in range(3):
            torch.testing.assert_close(model(x), ref(x))
        st = applied.status()["cards"][0]
        scopes = set(applied.scopes)
    assert {"layers.0", "layers.1"} <= scopes
    assert ("" in scopes) is not loop, scopes
    assert st["served"] == 3 * 3 and st["active"], st


def test_in_place_trials_time_only_calls_the_kernels_can_serve(promoted, tmp_path, monkeypatch):
    """A model called at other shapes than the profiled ones (a generation loop's steps) is tried
    in place only on the calls its kernels can serve: the module card on calls its specs match, a
    compiled scope on calls like one whose variant served a card. Before, the other calls timed
    the original forward on both sides, the kernel's side with its refusal's cost, and switched
    kernels off that were faster where they serve. The trials' timer is a stand-in (each path a
    fixed time, the kernels' faster) and a call saves far more than its dispatch costs: nothing
    here depends on this machine's load."""
    from forge_tui.runtime.apply import Trial

    ws, norm, sm = promoted
    root = installed_copy(ws, tmp_path / "ws", [norm.id, sm.id])
    monkeypatch.setattr(Guard, "__init__", with_gain(Guard.__init__, 1e6))
    monkeypatch.setattr(Trial, "time_call", lambda self, fn, with_kernel: (fn(), 10_000 if with_kernel else 30_000))
    tried = count_trials(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    odd = [torch.randn(n, 256) for n in (1, 2)]  # two variants that serve nothing: within the book's budget
    with torch.no_grad(), apply(model, root, trial_calls=2) as applied:
        module_trial = applied.guards[norm.id].trial
        assert module_trial is not None and sm.id in applied.guards
        for t in odd * 2:
            torch.testing.assert_close(model(t), ref(t))
        assert tried == []
        for _ in range(8):
            torch.testing.assert_close(model(x), ref(x))
    assert module_trial in tried and any(t is not module_trial for t in tried), tried


def test_a_card_off_for_good_keeps_its_checks_where_take_outs_is_off(promoted):
    """``Applied.take_outs`` off (the e2e bench's "every kernel falling back" variant): a switched-off
    module card's calls keep passing forge's forward, each counted, rather than the module getting
    its own forward back at the first call."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    for keep in (False, True):
        with torch.no_grad(), apply(model, ws, cards=[norm.id], only_faster=False) as applied:
            applied.take_outs = not keep
            applied.board.disable(applied.guards[norm.id].status, "switched off by the test")
            for _ in range(3):
                torch.testing.assert_close(model(x), wl.get_model()(x))
            st = {c["card"]: c for c in applied.status()["cards"]}[norm.id]
            assert ("forward" in model.norm.__dict__) is keep
            assert st["fallbacks"] == {"disabled": 3 if keep else 1} and applied.taken_out == ([] if keep else ["norm"])
