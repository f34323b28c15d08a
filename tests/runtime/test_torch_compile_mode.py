"""``Mode.TORCH_COMPILE``: module cards as custom ops in a model compiled after ``apply``, their
lean served path, and the verdicts that leave a card to torch.compile."""

import json

import pytest
import torch
from runtime_helpers import (
    load_workload,
    promoted_workspace,
)

from forge_tui.runtime import guard as guard_mod
from forge_tui.runtime.apply import Guard, Mode, apply
from forge_tui.runtime.kernel import CardKernel, KernelError
from forge_tui.runtime.status import format_status
from forge_tui.ui.widgets.fallback.status_table import rows as status_rows


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_torch_compile_keeps_the_kernel_as_a_custom_op(promoted):
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
            compiled = torch.compile(model, backend="aot_eager", fullgraph=False)
            got = compiled(x)
            got2 = compiled(x)
            # new input tensors each call, as a model's layers pass them: no recompiling (the
            # guard's inputs compared by identity with id() made dynamo recompile every call)
            with torch._dynamo.config.patch(error_on_recompile=True):
                for _ in range(3):
                    torch.testing.assert_close(compiled(x.clone()), expected)
            st = {c["card"]: c for c in applied.status()["cards"]}
            graph = torch._dynamo.explain(model)(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got2, expected)
    assert st[norm.id]["served"] >= 2  # the kernel ran inside the compiled model
    assert sm.id not in st or st[sm.id]["served"] == 0  # op cards: only through applied.backend()
    ops = [str(n.target) for g in graph.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("forge.k_" in o for o in ops), ops


def test_the_custom_op_never_hands_back_an_input_s_memory(promoted, monkeypatch):
    """The op's schema promises fresh outputs (what lets a compiler reorder around it): where the
    guard refuses a call and the card's own program returns a view of an input, the op copies it."""
    from forge_tui.runtime.custom_op import _CUSTOM_GUARDS

    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
        compiled = torch.compile(model, backend="aot_eager")
        compiled(x)
        name, guard = next((n, g) for n, g in _CUSTOM_GUARDS.items() if g.entry.card == norm.id)
        monkeypatch.setattr(guard, "serve", lambda inputs: None)
        monkeypatch.setattr(guard, "reference", lambda inputs: [inputs[0][:, :]])
        ns, short = name.split("::")
        (out,) = getattr(getattr(torch.ops, ns), short).default([x, model.norm.weight])
        assert applied.status()
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.testing.assert_close(out, x)


def test_a_settled_custom_op_serves_through_the_lean_path_with_every_check(promoted, monkeypatch):
    """Once its dispatch is timed, a guard of one output serves through ``Guard._build_lean``'s
    function (the compiled graph's custom op, the compiled scopes' and chains' served calls): it
    serves what matches; another shape or a switched-off card goes the general way, which counts
    the reason; a failing kernel switches the card off and the call falls back to the program."""
    from forge_tui.runtime.custom_op import _CUSTOM_GUARDS

    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    lean_calls: list[bool] = []
    build = Guard._build_lean

    def counting(self):
        build(self)
        lean = self._lean
        if lean is not None:
            def call(tensors):
                out = lean(tensors)
                lean_calls.append(out is not None and out is not guard_mod.NOT_SERVED)
                return out

            self._lean = call

    monkeypatch.setattr(Guard, "_build_lean", counting)
    with torch.no_grad(), apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False, cards=[norm.id]) as applied:
        compiled = torch.compile(model, backend="aot_eager")
        st = lambda: applied.status()["cards"][0]  # noqa: E731
        for _ in range(12):
            torch.testing.assert_close(compiled(x), ref(x))
        assert lean_calls and all(lean_calls) and st()["served"] == 12 and st()["dispatch_us"] is not None
        name, guard = next((n, g) for n, g in _CUSTOM_GUARDS.items() if g is applied.guards[norm.id])
        ns, short = name.split("::")
        op = getattr(getattr(torch.ops, ns), short).default
        n = len(lean_calls)
        wide = torch.randn(4, 256)
        (out,) = op([wide, model.norm.weight])  # another shape: the general path says why
        torch.testing.assert_close(out, ref.norm(wide))
        assert lean_calls[n:] == [False] and st()["served"] == 12
        assert st()["fallbacks"] == {"input 0: shape (4, 256)": 1}
        monkeypatch.setattr(CardKernel, "bind", lambda self, keep: failing)

        def failing(*a, **k):
            raise KernelError("forge_launch returned 7")

        guard._lean, guard._lean_tried = None, False
        compiled(x)  # the general path serves, and builds the lean path again on the failing launch
        assert guard._lean is not None
        torch.testing.assert_close(compiled(x), ref(x))
        s = st()
        assert not s["active"] and "kernel error: forge_launch returned 7" in s["disabled_reason"]
        assert s["fallbacks"].get("kernel error") == 1 and s["served"] == 13
        torch.testing.assert_close(compiled(x), ref(x))
        assert st()["served"] == 13 and st()["traced_fallbacks"] == {"disabled": 1}, st()


def test_a_kernel_switched_off_in_a_compiled_model_recompiles_to_one_graph(promoted):
    """A card switched off while a compiled model runs: the model recompiles to PyTorch's own code
    for it, still in one graph (fullgraph raises at any break: the fallback's count, behind the
    status board's lock, broke the graph at every call of the module); the status notes the graph
    that runs PyTorch's code there and why, once (its calls are not counted one by one)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
            counter = CompileCounterWithBackend("aot_eager")
            compiled = torch.compile(model, backend=counter, fullgraph=True)
            torch.testing.assert_close(compiled(x), expected)
            guard = applied.guards[norm.id]
            guard.board.disable(guard.status, "switched off by the test")
            outs = [compiled(x) for _ in range(3)]
            st = {c["card"]: c for c in applied.status()["cards"]}
    for out in outs:
        torch.testing.assert_close(out, expected)
    assert counter.frame_count == 2  # the first compile and one recompile, each one whole graph
    assert st[norm.id]["served"] == 1
    assert st[norm.id]["fallbacks"] == {} and st[norm.id]["traced_fallbacks"] == {"disabled": 1}
    # forge status and the app's fallback pane say so
    assert "compiled graphs running PyTorch's code here: 1 (disabled)" in format_status({"cards": [st[norm.id]]})
    (row,) = status_rows({"cards": [st[norm.id]]}, [])
    assert row[3] == "0" and row[5].endswith("fell back: none; compiled graphs: 1 (disabled)"), row


def test_no_dispatch_rule_switches_a_kernel_off_in_a_compiled_model(promoted, tmp_path):
    """In a compiled graph the kernel stands in for the compiler's code, not eager's ops: the op
    by op rule (dispatch costs more than the kernel saves against eager) would switch it off mid
    run, and every later call would take the card's program op by op until a recompile."""
    import shutil

    ws, norm, _ = promoted
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    ev = data["entries"][norm.id]["evidence"]
    ev.update(speedup_vs_eager=1.001, speedup_vs_compile=2.0, eager_us=ev["time_us"] * 1.001)  # saves ~0 µs
    path.write_text(json.dumps(data))
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    calls = Guard.DISPATCH_WARMUP + Guard.DISPATCH_SAMPLES + 2
    with torch.no_grad(), apply(model, root, mode=Mode.TORCH_COMPILE) as applied:
        compiled = torch.compile(model, backend="aot_eager")
        for _ in range(calls):
            compiled(x)
        st = {c["card"]: c for c in applied.status()["cards"]}[norm.id]
    assert st["dispatch_us"] is not None  # timed, as op by op, and reported
    assert st["active"] and st["served"] == calls and not st["fallbacks"], st


def test_a_kernel_slower_than_torch_compile_is_left_out_of_compiled_models(promoted, tmp_path):
    """Beating eager is not enough under torch.compile: a kernel whose evaluation measured it
    slower than torch.compile's code for the card serves eager models only."""
    import shutil

    ws, norm, _ = promoted
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][norm.id]["evidence"].update(speedup_vs_eager=2.0, speedup_vs_compile=0.8, compile_basis="device")
    path.write_text(json.dumps(data))
    model = load_workload().get_model()
    with apply(model, root, mode=Mode.TORCH_COMPILE) as applied:
        assert norm.id not in applied.guards and "torch.compile" in applied.skipped[norm.id]
        assert "device time" in applied.skipped[norm.id]  # its kernels were timed, not its call
    with apply(model, root) as applied:
        assert norm.id in applied.guards


def test_a_pointwise_module_card_is_left_to_torch_compile(promoted, tmp_path):
    """A module card whose program is pointwise (an activation, or a batch norm in inference, a
    per-channel affine map) is not a custom op in a torch.compile'd model: inductor fuses it with
    its neighbours (ResNet-50's batch norms with their ReLUs), which an opaque kernel stops. A
    program with a reduction (the RMSNorm's mean) stays a custom op; eager models keep both."""
    import shutil

    from forge_tui.runtime.graph import compile_worthy

    def bn(training, op="aten.native_batch_norm.default"):
        args = [{"$in": i} for i in range(5)] + ([training, 0.1, 1e-5] if training is not None else [0.1, 1e-5])
        return {"nodes": [{"op": op, "args": args}]}

    assert compile_worthy(bn(False)) and "pointwise" in compile_worthy(bn(False))
    assert compile_worthy(bn(None, "aten._native_batch_norm_legit_no_training.default"))
    assert compile_worthy(bn(True)) is None  # training: the batch's statistics, a reduction
    ws, norm, _ = promoted
    assert compile_worthy(norm.program) is None
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][norm.id]["signature"]["program"] = {
        "nodes": [{"op": "aten.relu.default", "args": [{"$in": 0}]}], "outputs": [{"$node": 0}]}
    path.write_text(json.dumps(data))
    model = load_workload().get_model()
    with apply(model, root, mode=Mode.TORCH_COMPILE) as applied:
        assert norm.id not in applied.guards and "pointwise" in applied.skipped[norm.id]
    with apply(model, ws.root, mode=Mode.TORCH_COMPILE) as applied:
        assert norm.id in applied.guards  # its own program reduces
