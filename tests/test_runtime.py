"""Promoted kernels back in the unmodified model (cpu backend, real compiled kernels): promotion
from a search with approval, the guarded runtime, live fallback status, torch.compile, export."""

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import timed_win, won_request
from torch.overrides import TorchFunctionMode

from forge_tui.cli import main
from forge_tui.config import parse_config
from forge_tui.errors import ForgeError
from forge_tui.evaluator import Evaluator
from forge_tui.promotion import approve, manifest, promote_kernel, reject, requests
from forge_tui.runtime import guard as guard_mod
from forge_tui.runtime import intercept, module_card, placement
from forge_tui.runtime.apply import Guard, Mode, apply, called_children
from forge_tui.runtime.graph import scope as scope_mod
from forge_tui.runtime.kernel import CardKernel, KernelError
from forge_tui.runtime.status import format_status, read_status
from forge_tui.ui.widgets.fallback.status_table import rows as status_rows
from forge_tui.workspace import profile_into_workspace

HERE = Path(__file__).parent
WORKLOAD = HERE / "data" / "workloads" / "runtime_model.py"
CPU = HERE / "candidates" / "cpu"
CFG = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}})


def load_workload():
    spec = importlib.util.spec_from_file_location("runtime_model", WORKLOAD)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    """A workspace with the model's RMSNorm (module card) and softmax (op card) promoted, each after
    a real evaluation of a real kernel."""
    return _norm_and_softmax_promoted(WORKLOAD, tmp_path_factory.mktemp("runtime"))


def _norm_and_softmax_promoted(workload: Path, root: Path):
    """(workspace, the RMSNorm module card, the softmax op card) of ``workload`` profiled on the cpu,
    both promoted after a real evaluation of a real kernel."""
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
    ws, _ = profile_into_workspace(workload, root / "ws", device="cpu", config_path=cfg)
    norm = next(c for c in ws.cards() if c.kind == "module")
    sm = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        for card, name in ((norm, "rmsnorm_good.cpp"), (sm, "softmax_good.cpp")):
            src = (CPU / name).read_text()
            r = ev.evaluate(card, src)
            assert r.correct, r.reason
            promote_kernel(ws, card.id, src, r, by="test")
    return ws, norm, sm


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
                                       _eager(wl, x))
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[norm.id]["served"] == 0 and st[sm.id]["served"] == 0
    assert st[norm.id]["fallbacks"] == {"input 0: shape (8, 256)": 1, "input 0: dtype float64": 1}
    assert set(st[sm.id]["fallbacks"]) == {"input 0: shape (8, 256)", "input 0: dtype float64"}


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


def _eager(wl, x):
    m = wl.get_model().to(x.dtype)
    return m(x)


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


def test_status_is_written_for_forge_status(promoted, capsys):
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, only_faster=False):
        model(x)
    live = read_status(ws.root)
    assert {c["card"] for c in live["cards"]} == {norm.id, sm.id}
    assert main(["status", str(ws.root)]) == 0
    out = capsys.readouterr().out
    assert f"{norm.id}: direct" in out and "served 1" in out and "active" in out


def test_served_calls_leave_the_status_file_to_a_thread_of_its_own(promoted, monkeypatch):
    """A served call never writes the status file itself (its JSON and the file system's latency
    were a stall inside the user's forward, once a second): the board's own thread writes the
    counts while calls happen, and undoing the model writes them as they stand."""
    import threading

    from forge_tui.runtime.status import StatusBoard

    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    writers: list[str] = []
    real_write = StatusBoard.write

    def write(self):
        writers.append(threading.current_thread().name)
        return real_write(self)

    monkeypatch.setattr(StatusBoard, "write", write)
    with torch.no_grad(), apply(model, ws, only_faster=False, trial_calls=0) as applied:
        applied.board.min_interval_s = 0.05
        n = len(writers)  # the install's own write
        served = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            model(x)
            served += 1
            live = read_status(ws.root)
            if live and any(c["served"] >= 1 for c in live["cards"]) and len(writers) > n:
                break
            time.sleep(0.01)
        assert writers[n:] and set(writers[n:]) == {"forge-status"}, writers
        assert live is not None and {c["card"]: c["served"] for c in live["cards"]}[norm.id] >= 1
    assert writers[-1] == threading.current_thread().name  # the undo's own write
    final = {c["card"]: c["served"] for c in read_status(ws.root)["cards"]}
    assert final[norm.id] == served


def test_a_damaged_manifest_is_one_clear_error(promoted, tmp_path, capsys):
    """forge status and apply on a manifest a hand edit broke: one line naming the file and the
    field, exit 1, no traceback, nothing written."""
    import shutil

    ws, norm, _ = promoted
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][norm.id]["disabled_reason"] = None
    path.write_text(json.dumps(data))
    assert main(["status", str(root)]) == 2  # the CLI's exit for bad input
    err = capsys.readouterr().err
    assert "manifest.json is damaged" in err and f"entries.{norm.id}.disabled_reason" in err and "Traceback" not in err
    with pytest.raises(ForgeError, match="damaged"):
        apply(load_workload().get_model(), root)
    assert json.loads(path.read_text()) == data


def test_kernels_that_do_not_pay_are_not_used(promoted, monkeypatch):
    """By default a kernel measured slower than eager is not installed, and one whose dispatch (the
    guard's own cost per call, measured on its first calls) eats what it saves is switched off:
    for a module card, where its call costs the host more than eager's own call of the module by
    what it saves (ResNet's batch norms were switched off on the H200 for a 22-28 µs dispatch
    while eager's calls of the same modules cost more)."""
    from forge_tui.runtime.apply import Guard

    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    assert manifest(ws).entries[sm.id].evidence.speedup_vs_eager < 1  # the double-precision softmax
    init = Guard.__init__
    monkeypatch.setattr(Guard, "__init__", _with_gain(init, 1e6))  # a call saves far more than dispatch costs
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
    monkeypatch.setattr(Guard, "__init__", _with_gain(init, 1e-3))
    cls = type(model.norm)
    real = cls.forward
    expected = real(model.norm, x).detach()
    why = Guard.EAGER_WHY
    for eager_costly in (True, False):
        def forward(self, h, costly=eager_costly):
            if costly:  # eager's call costs the host 2 ms: the kernel's is far cheaper
                time.sleep(0.002)
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


@pytest.mark.parametrize("kernel_faster", [True, False])
def test_each_kernel_is_tried_in_place_and_kept_only_if_faster_there(promoted, monkeypatch, kernel_faster):
    """The first calls of a module card alternate the kernel's path and PyTorch's, timed; the
    kernel stays only if its median was lower. Op cards: their scope with and without the
    interceptor. The timer is a stand-in (the test must not depend on this machine's load): it
    gives each path a fixed time."""
    from forge_tui.runtime.apply import TAKEN_OUT, Guard, Trial

    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    fast, slow = (10_000, 50_000) if kernel_faster else (50_000, 10_000)
    # a call saves far more than its dispatch costs: the dispatch rule (real timings) stays out of it
    monkeypatch.setattr(Guard, "__init__", _with_gain(Guard.__init__, 1e6))

    def fake_time(self, fn, with_kernel):
        return fn(), fast if with_kernel else slow

    monkeypatch.setattr(Trial, "time_call", fake_time)
    with torch.no_grad(), apply(model, ws, trial_calls=3) as applied:
        # the softmax card runs in double precision slower than eager: keep it for the trial
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
    from forge_tui.runtime.apply import TAKEN_OUT, Guard, Trial

    ws, norm, sm = promoted
    root = _installed_copy(ws, tmp_path / "ws", [sm.id])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    monkeypatch.setattr(Trial, "time_call", lambda self, fn, k: (fn(), 90_000 if k else 30_000))
    monkeypatch.setattr(Guard, "__init__", _with_gain(Guard.__init__, 1e6))
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


def _with_gain(init, gain_us):
    def patched(self, *a, **k):
        init(self, *a, **k)
        self.gain_us = gain_us

    return patched


def _installed_copy(ws, root: Path, card_ids) -> Path:
    """A copy of ``ws`` at ``root`` whose cards ``card_ids`` measured 2x eager: installed whatever
    the fixture's timing said (its double-precision softmax is slower than eager)."""
    import shutil

    shutil.copytree(ws.root, root)
    _measured_twice_as_fast(root, card_ids)
    return root


def _measured_twice_as_fast(root: Path, card_ids) -> None:
    """Record the promoted kernels of ``card_ids`` in the workspace at ``root`` as measured 2x
    eager, for tests whose subject is not the kernel's speed: the fixtures' timing runs on a
    loaded CI machine, where a kernel near eager's speed (the CPU layer norm, 1.2-1.6x on a quiet
    one) can measure slower and would not be used."""
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    for cid in card_ids:
        data["entries"][cid]["evidence"]["speedup_vs_eager"] = 2.0
    path.write_text(json.dumps(data))


def _count_trials(monkeypatch) -> list[Any]:
    """The trials (``Trial``) of the calls timed in place from now on, one entry a call."""
    from forge_tui.runtime.apply import Trial

    tried: list[Any] = []
    real = Trial.run

    def run(self, with_kernel, without):
        tried.append(self)
        return real(self, with_kernel, without)

    monkeypatch.setattr(Trial, "run", run)
    return tried


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
    assert row[3] == "none; compiled graphs: 1 (disabled)"


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


def test_export_loads_in_a_fresh_process_and_checks_itself(promoted, tmp_path):
    ws, norm, sm = promoted
    out = tmp_path / "export"
    assert main(["export", str(ws.root), str(out)]) == 0
    script = f"""
import importlib.util, json, torch
from forge_tui.runtime.apply import apply
spec = importlib.util.spec_from_file_location("m", {str(WORKLOAD)!r}); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
model, x = m.get_model(), m.get_inputs()[0]
with torch.no_grad():
    ref = model(x)
    with apply(model, {str(out)!r}, only_faster=False) as a:
        y = model(x)
        print(json.dumps({{"ok": bool(torch.allclose(y, ref, atol=1e-6)), "served": {{c["card"]: c["served"] for c in a.status()["cards"]}}}}))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["served"] == {norm.id: 1, sm.id: 1}
    # a damaged export is refused, with the file named
    so = next(out.glob(f"{norm.id}/*.so"))
    so.write_bytes(so.read_bytes()[:-16] + b"\0" * 16)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "does not match its checksum" in r.stderr and so.name in r.stderr


def test_a_build_for_another_arch_falls_back(promoted, tmp_path):
    ws, norm, sm = promoted
    man = manifest(ws)
    e = man.entries[norm.id]
    e.builds[0].arch = "some-other-cpu"
    folder = tmp_path / "kernels"
    import shutil

    shutil.copytree(ws.root / "kernels", folder)
    man.save(folder)
    shutil.copytree(folder, tmp_path / "ws2" / "kernels")
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, tmp_path / "ws2", only_faster=False) as applied:
        torch.testing.assert_close(model(x), wl.get_model()(x))
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert not st[norm.id]["active"] and "no build for cpu/" in st[norm.id]["disabled_reason"]
    assert st[sm.id]["served"] == 1


def test_approval_from_a_search(tmp_path, capsys):
    """A search finds a kernel faster than eager; it is a pending request with its evidence;
    --auto approves only what clears its thresholds; a rejection is recorded and not asked again."""
    from forge_tui.errors import ForgeError
    from forge_tui.session import Session

    def search(attempt: int) -> tuple[Any, bool]:
        root = tmp_path / f"try{attempt}"
        root.mkdir()
        cfg = root / "forge.toml"
        cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"
                       "[search]\nmin_gain = 0.0\n")
        ws, _ = profile_into_workspace(WORKLOAD, root / "ws", device="cpu", config_path=cfg)
        norm = next(c for c in ws.cards() if c.kind == "module")
        plan = root / "plan.json"
        plan.write_text(json.dumps({"cards": {norm.id: [str(CPU / "rmsnorm_good.cpp")]}}))
        session = Session.open(ws.root, cfg).with_search_settings(max_evals=1)
        with session.search(proposer=f"scripted:{plan}", backend="cpu", cards=[norm.id]) as s:
            s.run()
        return (ws, norm), won_request(ws.root)

    ws, norm = timed_win(search)
    pending = requests(ws)
    assert [r.card.id for r in pending] == [norm.id]
    req = pending[0]
    assert req.speedup > 1 and "adversarial-zeros" in req.evidence.input_sets and req.evidence.diff
    # --auto with a bar the kernel does not clear leaves it pending, saying why
    done, left = approve(ws, auto=__import__("forge_tui.promotion", fromlist=["AutoRule"]).AutoRule(min_speedup=1e6))
    assert not done and "under the" in left[0][1]
    assert main(["approve", str(ws.root), "--auto", "--max-spread", "100"]) == 0
    assert f"approved {norm.id}: {req.node}" in capsys.readouterr().out
    entry = manifest(ws).entries[norm.id]
    assert entry.approved_by.startswith("auto") and entry.builds[0].sha256 and entry.evidence.node == req.node
    assert (ws.root / entry.source).is_file() or (ws.root / "kernels" / entry.source).is_file()
    with ws.git() as repo:
        assert "approve" in repo.git("log", "-1", "--format=%s", "main")
    assert requests(ws) == []  # promoted: no longer pending
    with pytest.raises(ForgeError, match="no promotion request"):
        reject(ws, [norm.id])  # nothing pending to reject


def _slow_bound_calls(monkeypatch, which) -> None:
    """The specialised calls (``CardKernel.bind``, the fast paths) of the kernels ``which``
    accepts take 5 ms more, as ``__call__`` patched to sleep does for the general path."""
    import time

    real_bind = CardKernel.bind

    def slow_bind(self, keep):
        bound = real_bind(self, keep)
        if bound is None or not which(self):
            return bound

        def call(inputs, t0=0):
            time.sleep(0.005)
            return bound(inputs, t0)

        return call

    monkeypatch.setattr(CardKernel, "bind", slow_bind)


def test_bench_times_four_ways_and_switches_off_a_kernel_that_slows_the_forward(promoted, monkeypatch, capsys, tmp_path):
    """forge bench on the CPU: eager and eager + forge (torch.compile skipped to keep the test
    short), outputs checked; a kernel made slow (5 ms a call) is switched off in the manifest."""
    import shutil
    import time

    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")  # this test switches a kernel off: on a copy
    ws = Workspace.open(tmp_path / "ws")
    assert main(["bench", str(WORKLOAD), "-w", str(ws.root), "--no-compile", "--repeats", "5", "--keep-slower"]) == 0
    out = capsys.readouterr().out
    assert "eager+forge" in out and "agree" in out
    real = CardKernel.__call__

    def slow(self, inputs, timed=False, keep=-1):
        if self.out_specs[0].shape == list(norm.outputs[0].shape) and len(self.out_specs) == 1 and \
                len(inputs) == len(norm.inputs):
            time.sleep(0.005)
        return real(self, inputs, timed, keep)

    monkeypatch.setattr(CardKernel, "__call__", slow)
    _slow_bound_calls(monkeypatch, lambda k: k.out_specs[0].shape == list(norm.outputs[0].shape) and
                      len(k.out_specs) == 1 and len(k.out_specs) == len(norm.outputs))
    from forge_tui.e2e import bench

    r = bench(WORKLOAD, ws, device="cpu", repeats=5, with_compile=False, only_faster=False)
    assert norm.id in r.switched_off and "without" in r.switched_off[norm.id]
    entry = manifest(ws).entries[norm.id]
    assert not entry.enabled and entry.disabled_reason == r.switched_off[norm.id]
    model = load_workload().get_model()
    with apply(model, ws, only_faster=False) as applied:
        assert norm.id in applied.skipped and "switched off" in applied.skipped[norm.id]
        assert norm.id not in applied.guards


def test_bench_switches_kernels_off_under_torch_compile_when_compiled_is_faster_without(promoted, monkeypatch,
                                                                                         tmp_path):
    """torch.compile + forge never below torch.compile: the module kernel made slow (5 ms a call)
    inside a compiled model (aot_eager, to keep the test short) is switched off for compiled
    models only; eager models keep it."""
    import shutil
    import time

    from forge_tui.e2e import bench
    from forge_tui.workspace import Workspace

    src, norm, _ = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    real = CardKernel.__call__

    def slow(self, inputs, timed=False, keep=-1):
        if len(self.out_specs) == 1 and len(inputs) == len(norm.inputs):
            time.sleep(0.005)
        return real(self, inputs, timed, keep)

    monkeypatch.setattr(CardKernel, "__call__", slow)
    r = bench(WORKLOAD, ws, device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager")
    key = f"{norm.id} (under torch.compile)"
    assert key in r.switched_off and "compiled forward" in r.switched_off[key]
    man = manifest(ws)
    assert man.entries[norm.id].compile_disabled_reason == r.switched_off[key]
    # the slow kernel slowed the eager forward too, and was switched off there as well; the two
    # switches are apart: with the eager one undone, eager models use it and compiled ones do not
    man.entries[norm.id].enabled, man.entries[norm.id].disabled_reason = True, ""
    man.save(ws.root / "kernels")
    model = load_workload().get_model()
    with apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
        assert "switched off under torch.compile" in applied.skipped[norm.id]
    with apply(model, ws, only_faster=False) as applied:
        assert norm.id in applied.guards



def _stand_in_timer(monkeypatch, samples):
    """The bench's Timer replaced: each callable runs once (the kernels serve, so they are counted)
    and its samples are ``samples(name)`` (nothing depends on this machine's load)."""
    from forge_tui import e2e
    from forge_tui.timing import Stats

    class Timer:
        def __init__(self, device="cpu", *, warmup=3, repeats=20, cold_l2=True, **k):
            self.device, self.warmup, self.repeats, self.cold_l2 = device, warmup, repeats, cold_l2

        def time(self, fns):
            raw = {}
            for name, fn in fns.items():
                fn()
                raw[name] = samples(name)
            return {n: Stats.from_samples(v) for n, v in raw.items()}, raw, 0.0

    monkeypatch.setattr(e2e, "Timer", Timer)


def test_a_compiled_forward_slower_in_every_pair_switches_kernels_off_under_compile(promoted, monkeypatch, tmp_path):
    """The compiled forward 5% slower with forge in every interleaved pair, its quartiles
    overlapping without: the paired ratio decides (a stand-in timer; nothing depends on load)."""
    import shutil

    from forge_tui import e2e
    from forge_tui.workspace import Workspace

    src, norm, _ = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    base = [100.0, 120.0, 140.0, 160.0, 180.0]

    _stand_in_timer(monkeypatch, lambda name: [v * 1.05 for v in base] if name == "compile+forge" else list(base))
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager")
    assert r.times["compile"].q3 > r.times["compile+forge"].q1  # overlapping quartiles
    key = f"{norm.id} (under torch.compile)"
    assert key in r.switched_off and "0.952x" in r.switched_off[key], r.switched_off
    assert norm.id not in r.switched_off  # eager + forge was level with eager: kept there
    # the torch.compile verdict alone (e2e_bench's final four ways): nothing off op by op
    shutil.copytree(src.root, tmp_path / "ws2")
    ws2 = Workspace.open(tmp_path / "ws2")
    _stand_in_timer(monkeypatch, lambda name: [200.0] * 5 if name == "eager+forge" else
                    [v * 1.05 for v in base] if name == "compile+forge" else list(base))
    r = e2e.bench(WORKLOAD, ws2, device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager",
                  switch_off=False, switch_off_compile=True)
    assert key in r.switched_off and not [k for k in r.switched_off if "torch.compile" not in k], r.switched_off

def test_kernels_kept_under_compile_stay_on_only_if_a_process_of_their_own_agrees(promoted, monkeypatch, tmp_path):
    """The bench's process measures torch.compile + forge faster: the kernels stay on in compiled
    models only if the two, timed again in a process of their own, agree; where that process
    finds them slower, or cannot time them, they are switched off (stand-in timer and process)."""
    import shutil

    from forge_tui import e2e
    from forge_tui.workspace import Workspace

    src, norm, _ = promoted
    base = [100.0, 120.0, 140.0, 160.0, 180.0]
    key = f"{norm.id} (under torch.compile)"
    _stand_in_timer(monkeypatch, lambda name: [v * 0.8 for v in base] if name == "compile+forge" else list(base))
    asked: list[tuple] = []
    limits: list[float] = []

    def own(answer):
        def fresh(spec, ws, dev, dtype, repeats, warmup, backend, only_faster, timeout_s):
            asked.append((spec, ws.root, dev, backend))
            limits.append(timeout_s)
            return answer
        return fresh

    slower = ({"compile": list(base), "compile+forge": [v * 1.1 for v in base]}, {norm.id: 1})
    faster = ({"compile": list(base), "compile+forge": [v * 0.9 for v in base]}, {norm.id: 1})
    for n, (answer, off) in enumerate(((slower, "0.909x"), (faster, None), ("it did not finish in 900 s", "900 s"))):
        shutil.copytree(src.root, tmp_path / f"ws{n}")
        ws = Workspace.open(tmp_path / f"ws{n}")
        monkeypatch.setattr(e2e, "fresh_compile_pair", own(answer))
        r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager",
                      switch_off=False, switch_off_compile=True)
        assert asked[-1] == (WORKLOAD, ws.root, "cpu", "aot_eager")
        assert r.speedups["compile+forge/compile"].median == pytest.approx(1.25)
        if off is None:
            assert key not in r.switched_off and r.speedups[e2e.FRESH_COMPILE].median == pytest.approx(1 / 0.9)
            assert not manifest(ws).entries[norm.id].compile_disabled_reason
            assert "in a process of their own: 1.111x" in r.table()
        else:
            assert off in r.switched_off[key] and "process of its own" in r.switched_off[key], r.switched_off
            assert manifest(ws).entries[norm.id].compile_disabled_reason == r.switched_off[key]
    assert limits == [e2e.FRESH_TIMEOUT_S] * 3
    # without the check (or where this process already found them slower) no process is started
    n = len(asked)
    shutil.copytree(src.root, tmp_path / "ws-no-check")
    e2e.bench(WORKLOAD, Workspace.open(tmp_path / "ws-no-check"), device="cpu", repeats=5, only_faster=False,
              compile_backend="aot_eager", switch_off=False, switch_off_compile=True, own_process_check=False)
    assert len(asked) == n
    # a deadline: the process gets what is left before it; with too little left it is not started,
    # and the kernels go off in compiled models, unconfirmed
    import time

    for k, (left, started) in enumerate(((120.0, True), (3.0, False))):
        shutil.copytree(src.root, tmp_path / f"ws-deadline{k}")
        ws = Workspace.open(tmp_path / f"ws-deadline{k}")
        monkeypatch.setattr(e2e, "fresh_compile_pair", own(faster))
        before = len(asked)
        r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager",
                      switch_off=False, switch_off_compile=True, own_process_deadline=time.time() + left)
        assert (len(asked) > before) == started
        if started:
            assert 100.0 < limits[-1] <= 120.0 and key not in r.switched_off
        else:
            assert "were left for it before the run's deadline" in r.switched_off[key], r.switched_off


def test_a_process_of_their_own_times_compile_and_compile_with_forge(promoted):
    """``fresh_compile_pair`` starts ``python -m forge_tui.compile_pair``: the model built afresh,
    both compiled variants timed interleaved, the kernels served in the compiled forwards."""
    from forge_tui.e2e import fresh_compile_pair

    ws, norm, _ = promoted
    got = fresh_compile_pair(WORKLOAD, ws, "cpu", None, 3, 1, "aot_eager", False)
    assert not isinstance(got, str), got
    raw, served = got
    assert sorted(raw) == ["compile", "compile+forge"] and all(len(v) == 3 and min(v) > 0 for v in raw.values())
    assert served[norm.id] >= 3  # its warm-up and timed forwards
    # a workspace it cannot read: why, in one line, not an exception
    why = fresh_compile_pair(WORKLOAD, SimpleNamespace(root=ws.root / "missing"), "cpu", None, 3, 1, "aot_eager", False)
    assert isinstance(why, str) and "status 1" in why and "\n" not in why


def test_op_cards_sharing_an_intercepted_scope_are_left_out_together():
    """Leaving out one op card of a scope leaves the scope intercepted: the switch-off tries the
    scope's op cards as one unit; module cards stay units of their own."""
    from types import SimpleNamespace

    from forge_tui.e2e import switch_off_units

    def entry(kind, paths):
        return SimpleNamespace(signature=SimpleNamespace(kind=kind, module_paths=paths))

    man = SimpleNamespace(entries={
        "norm": entry("module", ["layers.0.norm"]), "add": entry("op", ["layers.0"]),
        "clone": entry("op", ["layers.0", "layers.1"]), "cat": entry("op", ["layers.1"]),
        "top": entry("op", []), "top2": entry("op", [""]), "mlp": entry("op", ["layers.0.mlp"])})
    units = switch_off_units(man, ["norm", "add", "cat", "clone", "top", "top2", "mlp"])
    assert sorted(sorted(u) for u in units) == [["add", "cat", "clone"], ["mlp"], ["norm"], ["top", "top2"]]


@pytest.mark.parametrize("forge_us", [[200.0, 201.0, 202.0], [103.0, 103.0, 103.0, 96.0, 96.0]],
                         ids=["slower-in-every-pair", "median-below-upper-quartile-above"])
def test_kernels_that_together_slow_the_forward_are_all_switched_off(promoted, monkeypatch, tmp_path, forge_us):
    """Never slower than eager: when no unit left out alone makes the forward measurably faster
    but the kernels left, together, do not make it faster than eager, they are all switched off;
    also where the paired ratio's median is below 1 while its upper quartile is above (0.971x
    [0.971, 1.042]), once measured again. The timer is a stand-in that reports exactly that (no dependence on this
    machine's load)."""
    import shutil

    from forge_tui import e2e
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")

    def samples(name):
        return list(forge_us) if name in ("eager+forge", "forge") else [100.0] * len(forge_us)

    _stand_in_timer(monkeypatch, samples)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=len(forge_us), with_compile=False, only_faster=False)
    assert set(r.switched_off) == {norm.id, sm.id}, r.switched_off
    assert all("kernels left" in why and "in eager" in why for why in r.switched_off.values())
    # the straddling ratio is measured again (the stand-in reports the same) before it decides
    assert all(("measured again" in why) == (forge_us[0] < 200) for why in r.switched_off.values())
    assert not any(e.enabled for e in manifest(ws).entries.values())
    assert e2e.AFTER_SWITCH_OFF not in r.speedups
    assert "serves none of its kernels now: the model runs eager's own code" in r.table()


def test_the_forward_is_timed_again_with_the_kernels_a_switch_off_left_on(promoted, monkeypatch, tmp_path):
    """Where the switch-off leaves one unit out and keeps the other, the bench reports the forward
    as it runs from now on: eager against eager + forge with the kernels left, timed again (a
    stand-in timer: the first unit's trials, on two pairs of copies, run faster without it, the
    forward with the rest faster than eager)."""
    import shutil

    from forge_tui import e2e
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    trials = []

    def samples(name):
        if name == "without":
            trials.append(name)
            return [50.0] * 5 if len(trials) <= 2 else [150.0] * 5
        return {"eager+forge": [110.0] * 5, "with": [100.0] * 5, "forge": [80.0] * 5}.get(name, [100.0] * 5)

    _stand_in_timer(monkeypatch, samples)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=5, with_compile=False, only_faster=False)
    assert len(r.switched_off) == 1 and len(trials) == 3, r.switched_off
    # the two units' first measurements, in the report beside what isolation promised them
    assert [(u["with_us"], u["without_us"]) for u in r.units] == [(100.0, 50.0), (100.0, 150.0)]
    assert all(isinstance(u["promised_us"], float) for u in r.units), r.units  # < 0 for a kernel slower alone
    assert "in the model" in r.table() and "isolation promised" in r.table()
    after = r.speedups[e2e.AFTER_SWITCH_OFF]
    assert after.median == pytest.approx(1.25)
    assert "eager + forge with the kernels left on: 1.250x" in r.table()
    assert sum(e.enabled for e in manifest(ws).entries.values()) == 1


def test_bench_with_graphs_times_both_graphed_forwards_or_says_why_not(promoted, monkeypatch, tmp_path):
    """--graphs: eager and eager + forge, each captured once and replayed, timed against each
    other after the four ways, eager's graph judged against eager and forge's against eager's
    graph; forge's graph serves the kernels even where the op-by-op switch-off turns them off; a
    capture that fails leaves both out, with the reason. (The capture needs CUDA: a stand-in
    replays the forward on the CPU.)"""
    import shutil

    from forge_tui import e2e
    from forge_tui.errors import ForgeError
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, switch_off=False, graphs=True)
    assert "CUDA graphs: not on this device" in r.notes and "eager (graph)" not in r.times

    captured = []

    def stand_in(run, warmup=3):
        captured.append("forward" in run.args[0].norm.__dict__)  # is forge's kernel in the captured model?
        return run, run()

    monkeypatch.setattr(e2e, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(e2e, "cuda_graphed", stand_in)
    samples = {"eager (graph)": 100.0, "eager+forge (graph)": 80.0, "eager": 100.0, "eager+forge": 200.0,
               "with": 200.0, "without": 100.0, "forge": 200.0}
    _stand_in_timer(monkeypatch, lambda name: [samples.get(name, 150.0)] * 3)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, only_faster=False, graphs=True)
    assert captured[:2] == [False, True]  # eager's graph: the model as it is; forge's: the kernels applied
    assert {k for k in r.switched_off if "CUDA graphs" not in k} == {norm.id, sm.id}  # op by op, slower: off ...
    assert set(e2e.GRAPH_VARIANTS) <= set(r.times)  # ... and still in forge's graph
    assert r.outputs_agree["eager+forge (graph)"] is None
    assert abs(r.speedups["graphs: forge/eager"].median - 1.25) < 0.01
    assert "in CUDA graphs, eager + forge vs eager: 1.250x" in r.table()

    def wrong_graph(run, warmup=3):
        out = run()
        return run, (out * 2 if "forward" in run.args[0].norm.__dict__ else out)

    monkeypatch.setattr(e2e, "cuda_graphed", wrong_graph)
    shutil.copytree(src.root, tmp_path / "ws2")  # the kernels not switched off
    ws = Workspace.open(tmp_path / "ws2")
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, switch_off=False, graphs=True)
    assert r.outputs_agree["eager+forge (graph)"] and "eager+forge (graph)" in r.forge_mismatches()

    calls = []

    def refuses_second(run, warmup=3):
        calls.append(1)
        if len(calls) == 2:
            raise ForgeError("RuntimeError: operation not permitted when stream is capturing")
        return run, run()

    monkeypatch.setattr(e2e, "cuda_graphed", refuses_second)

    class NoPieceEither:
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(e2e, "_piece_capturer", NoPieceEither)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, switch_off=False, graphs=True)
    assert not set(e2e.GRAPH_VARIANTS) & set(r.times) and "graphs: forge/eager" not in r.speedups
    assert not set(e2e.GRAPH_VARIANTS) & set(r.outputs_agree)
    assert any("whole forward could not be captured (RuntimeError: operation not permitted" in n for n in r.notes)
    assert any("not even in pieces: no piece of the forward could be captured" in n for n in r.notes), r.notes

    # the whole forward cannot be captured but its modules can: both graphed variants run in pieces
    from test_pieces import StandIn

    calls.clear()
    monkeypatch.setattr(e2e, "_piece_capturer", StandIn)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, switch_off=False, graphs=True)
    assert set(e2e.GRAPH_VARIANTS) <= set(r.times) and "graphs: forge/eager" in r.speedups
    assert r.outputs_agree["eager+forge (graph)"] is None, r.outputs_agree
    pieces_notes = [n for n in r.notes if n.startswith(("eager (graph): ", "eager+forge (graph): "))]
    assert len(pieces_notes) == 2 and all("modules from graphs" in n for n in pieces_notes), r.notes


def test_the_compiled_variants_are_freed_before_the_graphs_are_captured(promoted, monkeypatch, tmp_path):
    """The switch-off's copies and the captures need memory of their own: the compiled models the
    four ways timed are gone by then (the decoder's graphs on the H200 once failed out of memory
    behind them, and a switch-off's copy ran 25% slower than the bench's forward)."""
    import gc
    import shutil
    import weakref

    from forge_tui import e2e
    from forge_tui.workspace import Workspace

    src, _, _ = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    compiled: list[weakref.ref] = []
    real_compile = torch.compile

    def recording_compile(model, **kw):
        c = real_compile(model, **kw)
        compiled.append(weakref.ref(c))
        return c

    alive_at_capture: list[int] = []

    def stand_in(run, warmup=3):
        gc.collect()
        alive_at_capture.append(sum(r() is not None for r in compiled))
        return run, run()

    real_switch_off = e2e._switch_off_slower

    def switch_off(*a, **kw):
        gc.collect()
        alive_at_capture.append(sum(r() is not None for r in compiled))
        return real_switch_off(*a, **kw)

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(e2e, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(e2e, "cuda_graphed", stand_in)
    monkeypatch.setattr(e2e, "_switch_off_slower", switch_off)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=2, warmup=1, compile_backend="eager", graphs=True)
    assert len(compiled) == 2 and {"compile", "compile+forge"} <= set(r.times)
    assert alive_at_capture == [0, 0, 0]  # at the switch-off, and at each capture


def test_the_switch_off_in_cuda_graphs_is_its_own_verdict(promoted, monkeypatch, tmp_path, capsys):
    """--graphs decides on graphed forwards which kernels a captured model uses, apart from the
    op-by-op verdict: here the softmax's call costs the host more than it saves (off op by op)
    but wins in a graph, and the norm the other way round. mode="cuda_graph" then serves the
    softmax and not the norm; the op-by-op model the norm and not the softmax."""
    import functools
    import inspect
    import shutil

    from forge_tui import e2e
    from forge_tui.runtime.manifest import Manifest
    from forge_tui.timing import Stats
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    graphed: set[int] = set()

    def stand_in(run, warmup=3):
        graphed.add(id(run.args[0]))
        return run, run()

    def cost(model) -> float:  # what each kernel does to the forward, op by op and in a graph
        in_graph = id(model) in graphed
        t = 100.0
        fwd = model.norm.__dict__.get("forward")  # the norm's kernel, maybe under the softmax scope's wrapper
        while fwd is not None and not fwd.__qualname__.startswith("module_forward."):
            fwd = inspect.getclosurevars(fwd).nonlocals.get("original") if hasattr(fwd, "__code__") else None
        if fwd is not None:
            t += 30.0 if in_graph else -5.0
        if "forward" in model.__dict__:
            t += -10.0 if in_graph else 50.0
        return t

    class Timer:
        def __init__(self, device="cpu", *, warmup=3, repeats=20, cold_l2=True, **k):
            self.device, self.warmup, self.repeats, self.cold_l2 = device, warmup, repeats, cold_l2

        def time(self, fns):
            raw = {}
            for name, fn in fns.items():
                fn()
                model = fn.args[0] if isinstance(fn, functools.partial) else fn.__defaults__[0]
                raw[name] = [cost(model)] * 3
            return {n: Stats.from_samples(v) for n, v in raw.items()}, raw, 0.0

    monkeypatch.setattr(e2e, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(e2e, "cuda_graphed", stand_in)
    monkeypatch.setattr(e2e, "Timer", Timer)
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, only_faster=False, graphs=True)
    assert set(r.switched_off) == {sm.id, f"{norm.id} (in CUDA graphs)"}, r.switched_off
    assert "graphed forward ran 120.0 µs with it and 90.0 µs without" in r.switched_off[f"{norm.id} (in CUDA graphs)"]
    man = Manifest.load(ws.root / "kernels")
    assert not man.entries[sm.id].enabled and not man.entries[sm.id].graph_disabled_reason
    assert man.entries[norm.id].enabled and man.entries[norm.id].graph_disabled_reason
    wl = load_workload()
    with apply(wl.get_model(), ws, mode="cuda_graph", only_faster=False) as a:
        assert set(a.guards) == {sm.id} and a.skipped[norm.id].startswith("switched off in CUDA graphs: ")
    with apply(wl.get_model(), ws, only_faster=False) as a:
        assert set(a.guards) == {norm.id} and a.skipped[sm.id].startswith("switched off: ")
    capsys.readouterr()
    assert main(["status", str(ws.root)]) == 0
    printed = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "in CUDA graphs off: the graphed forward ran 120.0" in printed[norm.id]
    assert "in CUDA graphs off" not in printed[sm.id] and "switched off: the forward ran" in printed[sm.id]
    # the graph verdict is recorded in the workspace's history, as the op-by-op one is
    assert "in CUDA graphs" in subprocess.run(["git", "-C", str(ws.root), "log", "--format=%s", "main"],
                                               capture_output=True, text=True).stdout


def _count_intercepted(monkeypatch) -> list[str]:
    """The ops the runtime's interceptor sees from now on (its class wrapped to record them)."""
    seen: list[str] = []
    real = placement.interceptor_class

    def counting():
        base = real()

        class Counting(base):  # type: ignore[misc, valid-type]
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(str(func))
                return super().__torch_dispatch__(func, types, args, kwargs)

        return Counting

    monkeypatch.setattr(placement, "interceptor_class", counting)
    return seen


def test_an_op_card_scope_intercepts_its_own_calls_not_its_childrens(promoted, monkeypatch):
    """The softmax is called in the top module's own forward: its card records that module as its
    scope ("direct"), and the runtime intercepts the top module's own ops only; the RMSNorm child
    runs outside the interception (a decoder layer's `add` must not send the whole attention and
    MLP through Python). The count of ops the interceptor sees is the behaviour under test."""
    ws, norm, sm = promoted
    assert "direct" in sm.flags and sm.module_paths == [""], (sm.flags, sm.module_paths)
    seen = _count_intercepted(monkeypatch)
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


def test_an_op_card_in_a_compiled_scope_is_served_with_no_op_intercepted(promoted, monkeypatch):
    """The same card with the scope compiled (the default): the softmax in the scope's aten graph
    is replaced by the kernel's call, and no op of the forward passes the interceptor."""
    ws, norm, sm = promoted
    seen = _count_intercepted(monkeypatch)
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


@pytest.mark.parametrize("workload,children", [("runtime_model.py", 1), ("runtime_two_norms.py", 2)])
def test_a_scope_with_served_children_is_compiled_around_them(tmp_path, monkeypatch, workload, children):
    """The softmax's scope (the model) calls one RMSNorm, or two (one module card), served too:
    the scope is compiled all the same, each RMSNorm's card its custom op in the scope's one graph
    (``IN_GRAPH``), and no op passes the interceptor. Without that, each RMSNorm call is a graph
    break that its module card serves, and a scope with more such children than GRAPH_BREAKS is
    intercepted (the moe's attention, with its q and k norms, ran intercepted at 635-862 µs of
    host a call more than eager on the H200 while one was the limit)."""
    path = HERE / "data" / "workloads" / workload
    ws, norm, sm = _norm_and_softmax_promoted(path, tmp_path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    seen = _count_intercepted(monkeypatch)
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


def test_nested_scopes_each_intercept_their_own_calls(tmp_path):
    """A scope inside a scope: the inner module's own op is served under the inner scope, the outer
    module's under the outer, and neither sees the other's (the child wrapper leaves the outer
    interception before the inner one starts)."""
    from types import SimpleNamespace

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
    from forge_tui.runtime.apply import Guard

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


def _edited_copy(src, tmp_path, card_id, **signature):
    """A copy of the promoted workspace with fields of one card's manifest signature replaced."""
    import shutil

    from forge_tui.workspace import Workspace

    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    path = ws.root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][card_id]["signature"].update(signature)
    path.write_text(json.dumps(data))
    return ws


def test_an_op_card_scope_missing_from_the_model_is_skipped_not_fatal(promoted, tmp_path):
    """A workspace profiled on a deeper model names scopes this one lacks: those are skipped, the
    card serves where its scopes exist, and a card with none of them says so."""
    src, norm, sm = promoted
    ws = _edited_copy(src, tmp_path, sm.id, module_paths=["layers.31", ""])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False) as applied:
        model(x)
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert st[sm.id]["served"] == 1 and st[sm.id]["sites"] == ["ops under the model (compiled)"]
    ws2 = _edited_copy(src, tmp_path / "b", sm.id, module_paths=["layers.31"])
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


def test_a_workspace_profiled_before_direct_scopes_keeps_its_children_intercepted(promoted, tmp_path, monkeypatch):
    """Cards without the "direct" flag were captured with the whole subtree as their scope: the
    runtime keeps intercepting the children for them (the norm's ops pass the interceptor)."""
    src, norm, sm = promoted
    ws = _edited_copy(src, tmp_path, sm.id, flags=[f for f in sm.flags if f != "direct"])
    seen = _count_intercepted(monkeypatch)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False):
        model(x)
    assert "aten._softmax.default" in seen and any("rsqrt" in s for s in seen), seen


def test_scopes_serving_the_same_cards_share_one_trial():
    """The decoder's `add` in each layer: one trial pools their calls (one noisy layer must not
    switch the card off everywhere); scopes serving other cards have their own."""
    from types import SimpleNamespace

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


# ---- the served call's fast paths ----------------------------------------------------------------
def _with_workspace_softmax(promoted, tmp_path):
    """A copy of ``promoted`` with its softmax card's kernel replaced by one that asks for a
    workspace (softmax_workspace.cpp), after a real evaluation: (workspace, the softmax card)."""
    import shutil

    from forge_tui.workspace import Workspace

    src, _, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    code = (CPU / "softmax_workspace.cpp").read_text()
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        r = ev.evaluate(ws.card(sm.id), code)
    assert r.correct, r.reason
    promote_kernel(ws, sm.id, code, r, by="test")
    return ws, sm


def test_a_kernel_asks_its_workspace_size_once(promoted, monkeypatch, tmp_path):
    """The guard fixes every shape, stride and scalar the size depends on, so the runtime asks
    once, and every call still gets a workspace of that size: one buffer, kept for the stream."""
    import forge_tui.runtime.kernel as kernel_mod
    from forge_tui.kernel_abi import Library

    ws, sm = _with_workspace_softmax(promoted, tmp_path)
    asked, given = [], []
    real_size, real_call = Library.workspace_bytes, Library.call_raw

    def size(self, *a):
        asked.append(1)
        return real_size(self, *a)

    def call(self, *a):
        given.append(a[-1].numel())
        a[-1].zero_()  # the candidate refuses a workspace that still holds its last call's marker
        return real_call(self, *a)

    made, real_alloc = [], kernel_mod.alloc_workspace

    def alloc(*a):
        made.append(a)
        return real_alloc(*a)

    monkeypatch.setattr(Library, "workspace_bytes", size)
    monkeypatch.setattr(Library, "call_raw", call)
    monkeypatch.setattr(kernel_mod, "alloc_workspace", alloc)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, cards=[sm.id], only_faster=False) as applied:
            outs = [model(x) for _ in range(4)]
            st = applied.status()["cards"][0]
    assert st["served"] == 4 and st["active"], st
    assert len(asked) == 1 and len(given) == 4 and len(set(given)) == 1 and given[0] > 0
    assert len(made) == 1, made  # the workspace of the first call, kept for the others
    for o in outs:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-6)


def test_a_kernel_with_a_workspace_is_bound_like_a_plain_one(promoted, tmp_path):
    """``CardKernel.bind`` (the fast path of module cards and learned leaf sites) serves a kernel
    with a workspace too: its size asked once, one buffer kept per device and stream and handed to
    every call, the dropped outputs kept likewise, the output as eager's. (The candidate refuses a
    workspace that still holds its last call's marker: the test clears it between calls, as the
    evaluator's poison does.)"""
    import forge_tui.runtime.kernel as kernel_mod
    from forge_tui.kernel_abi import Library
    from forge_tui.promotion import kernels_dir, manifest
    from forge_tui.runtime.kernel import CardKernel

    ws, sm = _with_workspace_softmax(promoted, tmp_path)
    entry = manifest(ws).entries[sm.id]
    k = CardKernel(entry, kernels_dir(ws), "cpu")
    assert k.lib.needs_workspace and k.lib.plain_launch is None
    asked, real_size = [], Library.workspace_bytes

    def size(self, *a):
        asked.append(1)
        return real_size(self, *a)

    made, real_alloc = [], kernel_mod.alloc_workspace

    def alloc(*a):
        made.append(a)
        return real_alloc(*a)

    call = k.bind(0)
    assert call is not None
    x = torch.randn(16, 256)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Library, "workspace_bytes", size)
        mp.setattr(kernel_mod, "alloc_workspace", alloc)
        for _ in range(3):
            for w in k._scratch.values():
                w.zero_()
            torch.testing.assert_close(call([x], 0), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    assert len(asked) == 1 and len(made) == 1 and len(k._scratch) == 1
    (w,) = k._scratch.values()
    assert w.numel() == k._ws_bytes > 0
    with pytest.raises(kernel_mod.KernelError, match="returned 9"):
        call([x], 0)  # the marker left by the last call: the kept buffer was the one handed over


def test_outputs_are_allocated_with_the_cards_strides():
    """Like an input only where that input is dense (empty_like keeps its strides); contiguous,
    channels-last and a non-dense layout each come out with exactly the card's strides."""
    from forge_tui.cards import TensorSpec
    from forge_tui.runtime.kernel import _allocator

    x = torch.randn(2, 3, 4, 5)
    strided = x[:, :, :, ::2]
    cases = [  # (output spec, input specs, the inputs)
        ((2, 3, 4, 5), (60, 20, 5, 1), [x]),
        ((2, 3, 4, 5), (60, 1, 15, 3), [x]),  # channels-last from a contiguous input
        ((2, 3, 4, 3), tuple(strided.stride()), [strided]),  # matches the input, which is not dense
        ((2, 3, 4, 5), (60, 1, 15, 3), [x.contiguous(memory_format=torch.channels_last)]),
    ]
    for shape, stride, inputs in cases:
        out = TensorSpec(shape=list(shape), stride=list(stride), dtype="float32", role="output")
        ins = [TensorSpec(shape=list(t.shape), stride=list(t.stride()), dtype="float32") for t in inputs]
        k = CardKernel.__new__(CardKernel)
        k.device, k._empty, k._empty_like, k._empty_plain = "cpu", [_allocator(out, ins)], torch.empty_like, torch.empty
        (got,) = k._outputs(inputs)
        assert (tuple(got.shape), got.stride(), got.dtype) == (shape, stride, torch.float32)
    # the dense matches are allocated like their input
    assert _allocator(TensorSpec(shape=[2, 3, 4, 5], stride=[60, 20, 5, 1], dtype="float32"),
                      [TensorSpec(shape=[2, 3, 4, 5], stride=[60, 20, 5, 1], dtype="float32")])[0] == 0


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



def _layernorm_workload():
    """tests/data/workloads/layernorm.py, imported."""
    spec = importlib.util.spec_from_file_location("layernorm_wl", HERE / "data" / "workloads" / "layernorm.py")
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    return wl

@pytest.fixture(scope="module")
def layer_norm_ws(tmp_path_factory):
    """nn.LayerNorm as a leaf module: its one op, native_layer_norm, is an op card scoped to it
    (the module returns the first of the op's three outputs), promoted after a real evaluation."""
    root = tmp_path_factory.mktemp("leaf")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
    ws, _ = profile_into_workspace(HERE / "data" / "workloads" / "layernorm.py", root / "ws", device="cpu",
                                   config_path=cfg)
    card = next(c for c in ws.cards() if c.target == "aten.native_layer_norm.default")
    assert card.module_paths == ["norm"]
    src = (CPU / "layernorm_twopass.cpp").read_text()
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        r = ev.evaluate(card, src)
    assert r.correct, r.reason
    promote_kernel(ws, card.id, src, r, by="test")
    _measured_twice_as_fast(ws.root, [card.id])
    return ws, card


@pytest.mark.parametrize("eager_costly", [True, False])
@pytest.mark.parametrize("site", ["leaf", "interceptor"])
def test_an_op_cards_dispatch_is_weighed_against_eager_s_own_call(layer_norm_ws, monkeypatch, site, eager_costly):
    """An op card served at a learned leaf site, or through the interceptor (the leaf not
    learned), whose dispatch looks costlier than what the kernel saves is judged as a module card
    is: eager's own call (the leaf's forward, or the op) is timed in the kernel's place
    (EAGER_SAMPLES calls, counted as fallbacks) and the kernel stays where its whole call costs the
    host no more than eager's by what it saves. (On the H200 a group norm leaf was switched off for
    a 31 µs dispatch inside the forward, where eager's own call of the module cost it more.)"""
    from forge_tui.runtime.apply import Guard
    from forge_tui.runtime.kernel import CardKernel

    ws, card = layer_norm_ws
    model, x = _layer_norm_model()
    with torch.no_grad():
        expected = model(x)
    if site == "interceptor":
        monkeypatch.setattr(placement, "direct_leaf", lambda module: False)  # every call through the interceptor
    monkeypatch.setattr(Guard, "__init__", _with_gain(Guard.__init__, 1e-3))  # dispatch always looks too costly
    if eager_costly:  # eager's call costs the host 2 ms more where it is timed in the kernel's place
        real = Guard.time_eager

        def time_eager(self, call):
            return real(self, lambda: (time.sleep(0.002), call())[1])

        monkeypatch.setattr(Guard, "time_eager", time_eager)
    else:  # the kernel's call costs the host 2 ms more than eager's, on either path
        real_call, real_bind = CardKernel.__call__, CardKernel.bind

        def call(self, *a, **k):
            time.sleep(0.002)
            return real_call(self, *a, **k)

        def bind(self, keep):
            bound = real_bind(self, keep)

            def slow(inputs, t0=0):
                time.sleep(0.002)
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
    wl = _layernorm_workload()
    ws, card = layer_norm_ws
    seen = _count_intercepted(monkeypatch)
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


def _one_card_promoted(tmp_path, workload: "str | Path", target: str, src: str | None = None):
    """(workspace, card, the workload's module): ``workload`` (in tests/data/workloads) profiled on
    the cpu, its ``target`` op card given ``src`` (default: its template family's first cpu kernel),
    evaluated and promoted."""
    from forge_tui.templates.registry import match

    cfg = tmp_path / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
    path = workload if isinstance(workload, Path) else HERE / "data" / "workloads" / workload
    ws, _ = profile_into_workspace(path, tmp_path / "ws", device="cpu", config_path=cfg)
    card = next(c for c in ws.cards() if c.target == target)
    if src is None:
        fam, m = match(card)
        src = fam.render(m, fam.initial(m, "cpu"), "cpu")
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        r = ev.evaluate(card, src)
    assert r.correct, r.reason
    promote_kernel(ws, card.id, src, r, by="test")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    return ws, card, wl


def test_a_leaf_that_copies_its_input_before_its_served_op_is_learned(tmp_path, monkeypatch):
    """nn.GroupNorm handed a tensor laid out channels innermost copies it contiguous (aten.clone)
    and then calls its one op, the served group norm: the site is learned with the copy, later
    calls make the copy themselves and go to the guard without the interceptor, and agree with
    eager. The op's mean and rstd, which the module drops, are not allocated per call: the kernel
    writes them to buffers it keeps. An input that is contiguous already (eager copies nothing)
    is served the same way: ``contiguous()`` hands it back as it is."""
    ws, card, wl = _one_card_promoted(tmp_path, "groupnorm_channels_last.py", "aten.native_group_norm.default")
    model, (x, attn) = wl.get_model(), wl.get_inputs()
    seen = _count_intercepted(monkeypatch)
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
            n = _settle(applied, lambda: model(x, attn))  # the fast path: the copy, the kept outputs
            settled = [model(x, attn) for _ in range(3)]
            assert len(seen) == 4 and applied.status()["cards"][0]["served"] == 6 + n + 3
            assert len(kernel._dead) == 2
    for o in settled:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)
    for o in outs:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)
    assert not any(o is p for o in outs for p in kernel._dead.values())
    torch.testing.assert_close(direct, model.norm(dense), rtol=1e-5, atol=1e-5)


EPS = [1e-5]


class _GlobalEps(torch.nn.LayerNorm):
    """A layer norm whose forward reads a global: no module attribute says the call changed."""

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, EPS[0])


def _layer_norm_model():
    wl = _layernorm_workload()
    return wl.get_model(), wl.get_inputs()[0]


def test_only_forwards_that_read_nothing_else_are_learned(layer_norm_ws, monkeypatch):
    """A subclass that overrides nn.LayerNorm's forward may read what no attribute shows (here a
    global eps): it is never learned, and a changed global reaches PyTorch, not the card."""
    ws, _ = layer_norm_ws
    seen = _count_intercepted(monkeypatch)
    model, x = _layer_norm_model()
    norm = _GlobalEps(256)
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


@pytest.fixture(scope="module")
def square_ws(tmp_path_factory):
    """tests/data/workloads/leaf_mul.py: `m(x, x)`, its `mul` card of one input promoted."""
    root = tmp_path_factory.mktemp("square")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
    ws, _ = profile_into_workspace(HERE / "data" / "workloads" / "leaf_mul.py", root / "ws", device="cpu",
                                   config_path=cfg)
    card = next(c for c in ws.cards() if c.target == "aten.mul.Tensor")
    assert card.module_paths == ["m"]
    src = (CPU / "square.cpp").read_text()
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        r = ev.evaluate(card, src)
    assert r.correct, r.reason
    promote_kernel(ws, card.id, src, r, by="test")
    return ws


def test_a_learned_call_with_the_same_tensor_twice_does_not_serve_two_tensors(square_ws, monkeypatch):
    """Learned from `m(x, x)` (the card squares its one input), the call `m(x, y)` is another call:
    it goes to the interceptor, which runs PyTorch's `x * y`."""
    spec = importlib.util.spec_from_file_location("leaf_mul", HERE / "data" / "workloads" / "leaf_mul.py")
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    seen = _count_intercepted(monkeypatch)
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


class _PlusOne(TorchFunctionMode):
    """A user's mode that changes what layer_norm returns (as a fake-quantisation mode would)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.nn.functional.layer_norm else out


def test_a_learned_call_under_a_mode_or_transform_goes_through_pytorch(layer_norm_ws):
    """After it is learned, a call under a __torch_function__ mode, under vmap or with a forward-AD
    dual tensor is not served directly: each reaches PyTorch's dispatch, the result is what eager
    gives under the same mode or transform, and the kernel stays active (handed vmap's batched
    tensor, which has no storage, it would fail and be disabled)."""
    import torch.autograd.forward_ad as fwAD

    ws, _ = layer_norm_ws
    model, x = _layer_norm_model()
    xs, tangent = torch.randn(4, 16, 256), torch.randn_like(x)
    with torch.no_grad():
        with _PlusOne():
            ref_mode = model(x)
        ref_vmap = torch.vmap(model)(xs)
        with fwAD.dual_level():
            ref_tangent = fwAD.unpack_dual(model(fwAD.make_dual(x, tangent))).tangent
        with apply(model, ws, only_faster=False) as applied:
            for _ in range(3):
                model(x)
            served = applied.status()["cards"][0]["served"]
            with _PlusOne():
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


def test_the_bench_counts_garbage_collections_by_variant_with_the_setup_frozen():
    import gc

    from forge_tui.e2e import GcPauses

    p = GcPauses()
    junk = [[i] for i in range(1000)]  # what the setup built
    with p:
        assert gc.get_freeze_count() >= len(junk)  # out of the collector's scans while timing
        p.run("eager+forge", lambda: [gc.collect() for _ in range(2)])
        p.run("eager", lambda: None)
    gc.collect()  # outside: not counted
    assert gc.get_freeze_count() == 0
    assert len(p.pauses["eager+forge"]) == 2 and "eager" not in p.pauses
    assert p.notes()[0].startswith("garbage collection in the timed eager+forge forwards: 2 pauses")


def test_the_switch_off_trials_time_with_the_setup_frozen_too(monkeypatch):
    """Each switch-off trial adds a copy of the model; its timed forwards, like the bench's, run
    with what existed before out of the collector's scans, and the freeze ends with the trial."""
    import gc

    from forge_tui import e2e
    from forge_tui.timing import Timer

    class Undo:
        def undo(self):
            pass

    monkeypatch.setattr(e2e, "apply", lambda *a, **k: Undo())
    frozen: list[int] = []

    class Wl:
        def run(self, model, inputs):
            frozen.append(gc.get_freeze_count())
            return model(*inputs)

    model = torch.nn.Linear(4, 4)
    e2e._time_against(Wl(), [torch.randn(2, 4)], None, "cpu", Timer("cpu", warmup=1, repeats=3), True,
                      model, model, [], ("with", "without"))
    assert frozen and min(frozen) > 0
    assert gc.get_freeze_count() == 0


def test_each_switch_off_unit_is_timed_against_a_fresh_copy_with_every_kernel(monkeypatch):
    """Each unit left out is timed against its own fresh copy of the model with every kernel, built
    and applied as the copy without it is, and undone after: no copy carries what earlier units
    ran on it (on the H200 one kept for every unit ran 200-460 µs slower than the bench's own)."""
    from types import SimpleNamespace

    from forge_tui import e2e
    from forge_tui.timing import Stats

    made: list[tuple[object, tuple[str, ...]]] = []  # the objects themselves: kept alive, their ids unique
    undone: list[object] = []

    class Applied:
        def __init__(self, model, cards):
            self.model = model
            made.append((model, tuple(cards)))

        def undo(self):
            undone.append(self.model)

    monkeypatch.setattr(e2e, "apply", lambda model, ws, cards=(), **k: Applied(model, cards))
    bases: list[object] = []
    same = Stats.from_samples([100.0, 101.0, 102.0])

    def timed(wl, inputs, ws, dev, timer, only_faster, base, model, cards, names):
        bases.append(base)
        return same, same, Stats.from_samples([1.0, 1.0, 1.0])

    monkeypatch.setattr(e2e, "_time_against", timed)
    served = ["mod-a", "mod-b", "mod-c"]
    man = SimpleNamespace(entries={c: SimpleNamespace(signature=SimpleNamespace(kind="module", module_paths=[c]))
                                   for c in served})
    applied = SimpleNamespace(status=lambda: {"cards": [{"card": c, "served": 1} for c in served]})
    raw = {"eager": [100.0, 100.0, 100.0], "eager+forge": [50.0, 50.0, 50.0]}
    stats = {k: Stats.from_samples(v) for k, v in raw.items()}
    out, _ = e2e._switch_off_slower(None, torch.nn.Linear(2, 2), [], None, man, applied, "cpu", None, True, stats, raw)
    assert out == {}
    assert len(bases) == len(served) and len({id(b) for b in bases}) == len(served)  # a fresh copy per unit
    assert all(m is b for (m, _), b in zip(made, bases)) and all(cards == tuple(served) for _, cards in made)
    assert len(undone) == len(bases) and all(u is b for u, b in zip(undone, bases))


def test_a_unit_is_switched_off_only_when_a_second_pair_of_copies_agrees(monkeypatch):
    """A unit that measured slower once (4674 µs with it, 4174 without: the H100's diffusion,
    2026-12-06, where the bench's own copies with it ran 4069-4184) is measured again on another
    pair of fresh copies and stays on when that disagrees; one slower in both is switched off, the
    reason giving both measurements."""
    from types import SimpleNamespace

    from forge_tui import e2e
    from forge_tui.timing import Stats

    def st(median):
        return Stats.from_samples([median - 10.0, median, median + 10.0])

    monkeypatch.setattr(e2e, "apply", lambda model, ws, cards=(), **k: SimpleNamespace(undo=lambda: None))
    committed: list[list[str]] = []
    monkeypatch.setattr(e2e, "commit_manifest", lambda ws, man, kind, subject, lines, cards: committed.append(cards))
    served = ["mod-a", "mod-b"]

    def run(pairs):
        pairs = list(pairs)
        calls: list[tuple[str, ...]] = []

        def timed(wl, inputs, ws, dev, timer, only_faster, base, model, cards, names):
            calls.append(tuple(cards))
            if names == ("with", "without"):
                w, wo = pairs.pop(0)
                return st(w), st(wo), st(1.0)
            return st(5000.0), st(4200.0), Stats.from_samples([1.17, 1.18, 1.19])

        monkeypatch.setattr(e2e, "_time_against", timed)
        man = SimpleNamespace(entries={c: SimpleNamespace(signature=SimpleNamespace(kind="module", module_paths=[c]),
                                                          enabled=True, disabled_reason=None) for c in served})
        applied = SimpleNamespace(status=lambda: {"cards": [{"card": c, "served": 1} for c in served]})
        raw = {"eager": [5000.0] * 3, "eager+forge": [4100.0] * 3}
        stats = {k: Stats.from_samples(v) for k, v in raw.items()}
        units: list[dict] = []
        out, _ = e2e._switch_off_slower(None, torch.nn.Linear(2, 2), [], None, man, applied, "cpu", None, True,
                                        stats, raw, units)
        return out, calls, man, units

    # mod-a: slower once, then not; mod-b: never slower
    out, calls, man, units = run([(4674.0, 4174.0), (4150.0, 4160.0), (4100.0, 4150.0)])
    assert out == {} and calls == [("mod-b",), ("mod-b",), ("mod-a",)] and committed == []
    # each unit's first measurement is kept for the bench's report
    assert units == [{"cards": ["mod-a"], "with_us": 4674.0, "without_us": 4174.0},
                     {"cards": ["mod-b"], "with_us": 4100.0, "without_us": 4150.0}]
    assert all(e.enabled for e in man.entries.values())
    # mod-a slower in both pairs: off, with both measurements
    out, calls, man, _ = run([(4674.0, 4174.0), (4600.0, 4150.0), (4100.0, 4150.0)])
    assert list(out) == ["mod-a"] and not man.entries["mod-a"].enabled and committed == [["mod-a"]]
    assert "4674.0 µs with it and 4174.0 µs without, then 4600.0 and 4150.0 on fresh copies" in out["mod-a"]
    assert calls[:2] == [("mod-b",), ("mod-b",)] and calls[-1] == ("mod-b",)  # the kernels left, timed together


def test_each_units_saving_in_the_model_is_set_beside_what_isolation_promised():
    """A card at 20% of a 1000 µs eager forward, 4x faster in isolation, promises 150 µs; one
    without a speedup promises nothing; the bench's table says, per unit, what it saved in the
    model (the forward without it less with it) beside that."""
    from types import SimpleNamespace as NS

    from forge_tui import e2e
    from forge_tui.timing import Stats

    ws = NS(cards=lambda: [NS(id="rms", share=0.2, kind="module", module_paths=["n"]),
                           NS(id="gelu", share=0.1, kind="op", module_paths=[])])

    def entry(sp):
        return NS(signature=NS(kind="module"), evidence=NS(speedup_vs_eager=sp))

    man = NS(entries={"rms": entry(4.0), "gelu": entry(None)})
    assert e2e._promised_us(ws, man, 1000.0) == {"rms": pytest.approx(150.0)}
    one = Stats.from_samples([1000.0])
    r = e2e.BenchResult("cpu", {"eager": one}, {}, {}, None, {"rms": 3}, units=[
        {"cards": ["rms"], "with_us": 800.0, "without_us": 900.0, "promised_us": 150.0},
        {"cards": ["gelu"], "with_us": 800.0, "without_us": 790.0, "promised_us": None}])
    table = r.table()
    assert "in the model rms saved 100 µs a forward (800 with it, 900 without); isolation promised 150" in table
    assert "in the model gelu saved -10 µs a forward (800 with it, 790 without)\n" in table + "\n"
    assert r.to_json()["units"][0]["promised_us"] == 150.0


STRIDE_MISS, SHAPE_MISS = "input 1: strides (2,)", "input 0: shape (4, 256)"


def _settle(applied, call, path="norm", calls=40):
    """Run ``call()`` until the leaf at ``path`` serves through its fast path; the calls made."""
    leaf = applied.leaves[path]
    for n in range(1, calls + 1):
        call()
        if leaf.fast is not None:
            return n
    raise AssertionError(f"no fast path after {calls} calls")


def test_a_settled_learned_site_serves_through_its_fast_path_with_every_check(layer_norm_ws, monkeypatch):
    """Once its guard has timed its dispatch, a learned leaf's call takes the fast path
    (``_LeafSites._fast``): it serves the call, and each check of the general path still holds
    there, each one sending the call back to the general path, which judges it as before: a
    changed attribute, a replaced parameter, a parameter changed in place to another dtype,
    another shape, another layout, gradients, autocast, a __torch_function__ mode, vmap, forward
    AD, and a kernel that fails."""
    import torch.autograd.forward_ad as fwAD

    ws, _ = layer_norm_ws
    seen = _count_intercepted(monkeypatch)
    model, x = _layer_norm_model()
    norm = model.norm
    F = torch.nn.functional

    def eager(t, **kw):
        return F.layer_norm(t, (256,), kw.get("w", norm.weight), norm.bias, kw.get("eps", norm.eps))

    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        n = _settle(applied, lambda: model(x))
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
        with _PlusOne():
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
    from forge_tui.runtime.apply import Guard, OpGuard
    from forge_tui.runtime.leaf import LeafSites as _LeafSites

    ws, card, wl = _one_card_promoted(tmp_path, "layernorms_shared.py", "aten.native_layer_norm.default",
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


def test_a_kernels_first_calls_do_not_count_toward_its_dispatch_cost(promoted, monkeypatch):
    """The first served calls in a model (allocator growth, a leaf site still being learned) are
    slow once: they are timed but left out of the dispatch cost the guard weighs."""
    from forge_tui.runtime.apply import Guard

    ws, norm, _ = promoted
    monkeypatch.setattr(Guard, "__init__", _with_gain(Guard.__init__, 50.0))  # a call saves 50 µs
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


def test_the_final_switch_off_measures_again_when_its_quartiles_straddle_one(promoted, monkeypatch):
    """The kernels left, together, against eager: a paired ratio whose median is below 1 but whose
    upper quartile is above it is measured again, twice as long, and that decides: kept when the
    second measurement is faster (its ratio reported), switched off, saying so, when it is not;
    a ratio below 1 in both quartiles switches off without measuring again."""
    import shutil
    import tempfile

    from forge_tui import e2e
    from forge_tui.timing import Stats, Timer, paired_ratio
    from forge_tui.workspace import Workspace

    src, norm, _ = promoted

    class Applied:
        def status(self):
            return {"cards": [{"card": norm.id, "served": 3}]}

    def ratio(median, q1, q3):
        return Stats(median=median, mean=median, min=q1, max=q3, q1=q1, q3=q3, n=20)

    forward = ratio(100.0, 99.0, 101.0)
    timed: list[int] = []

    def run(tmp, first_raw, second):
        """(switched off, reported ratio, repeats of the measurements made again)."""
        shutil.copytree(src.root, tmp, dirs_exist_ok=True)
        ws = Workspace.open(tmp)
        man = manifest(ws)
        del timed[:]

        def time_against(wl, inputs, ws_, dev, timer, only_faster, base, model, cards, names):
            timed.append(timer.repeats)
            return forward, forward, second

        monkeypatch.setattr(e2e, "_time_against", time_against)
        out, after = e2e._switch_off_slower(None, None, None, ws, man, Applied(), "cpu", Timer("cpu", repeats=10),
                                            False, {"eager": forward, "eager+forge": forward}, first_raw)
        return out, after, list(timed)

    straddles = {"eager": [98.0, 99.0, 100.0, 103.0], "eager+forge": [100.0, 100.0, 100.0, 100.0]}
    assert paired_ratio(straddles["eager"], straddles["eager+forge"]).q3 > 1 > \
        paired_ratio(straddles["eager"], straddles["eager+forge"]).median
    with tempfile.TemporaryDirectory() as tmp:
        out, after, again = run(Path(tmp) / "a", straddles, ratio(1.04, 1.02, 1.06))
        assert out == {} and again == [20] and after.median == 1.04
        out, after, again = run(Path(tmp) / "b", straddles, ratio(0.97, 0.95, 0.99))
        assert again == [20] and norm.id in out and "measured again, 20 forwards, after 0.995x" in out[norm.id]
        below = {"eager": [97.0, 98.0, 98.0, 99.0], "eager+forge": [100.0] * 4}
        out, after, again = run(Path(tmp) / "c", below, ratio(1.5, 1.4, 1.6))
        assert again == [] and norm.id in out and "measured again" not in out[norm.id]


def _scope_calls(promoted, model, calls):
    """(outputs of ``calls(model)``, the root scope) with the softmax card served in the model's
    compiled root scope."""
    ws, _, sm = promoted
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False) as applied:
        outs = calls(model)
        scope = applied.scopes[""]
        st = {c["card"]: c for c in applied.status()["cards"]}
    return outs, scope, st[sm.id]


def test_a_compiled_scope_runs_dynamos_code_directly_while_calls_are_alike(promoted):
    """After the call that compiles it, a scope runs the code Dynamo made for that call without
    Dynamo (its per-call machinery cost the H200 host more than the kernels saved): same results,
    the kernel served in each call."""
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
    outs, scope, st = _scope_calls(promoted, model, lambda m: [m(x.clone()) for _ in range(4)])
    for o in outs:
        torch.testing.assert_close(o, expected)
    assert scope.direct is not None, scope.direct_why
    assert scope.direct.calls == 3 and st["served"] == 4
    # its graphs are called without the wrapper that switches Dynamo off around them (nothing to
    # switch off on the direct path: 4 µs a call of the decoder's attention on the CPU)
    graphs = [v for n, v in scope.direct.fn.__globals__.items() if n.startswith("__compiled_fn")]
    assert graphs and not any(hasattr(g, "_torchdynamo_orig_callable") for g in graphs), graphs


def _count_scope_compiles(monkeypatch) -> list[int]:
    """The graphs Dynamo hands compiled scopes from now on, each as the id of the scope whose
    backend took it (a shared copy's backend is its first scope's)."""
    from forge_tui.runtime import graph as graph_mod

    compiles: list[int] = []
    real = graph_mod.GraphScope._backend

    def counting(self, shared=False):
        backend = real(self, shared)

        def wrapped(gm, example_inputs):
            compiles.append(id(self))
            return backend(gm, example_inputs)

        return wrapped

    monkeypatch.setattr(graph_mod.GraphScope, "_backend", counting)
    return compiles


@pytest.mark.parametrize("first", ["profiled", "odd"])
def test_a_scope_stops_compiling_for_shapes_its_cards_do_not_serve(promoted, monkeypatch, first):
    """A generation loop meets new shapes at every step: a scope compiled a variant for each (to
    Dynamo's limit of 8), with nothing served in them. It compiles none after the first variant its
    cards do not serve once one they serve exists (``first="odd"``: a first call at another shape
    compiles a variant that serves nothing, and the profiled shape's variant is still compiled,
    served, and then run by the direct call). Calls no variant covers then run as written and are
    counted as fallbacks with their reason; every output agrees with eager's."""
    from forge_tui.runtime import graph as graph_mod

    compiles = _count_scope_compiles(monkeypatch)
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

    outs, scope, st = _scope_calls(promoted, model, calls)
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
    outs, scope, st = _scope_calls(promoted, model, lambda m: [(t, m(t)) for t in shapes])
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

    outs, scope, st = _scope_calls(promoted, model, calls)
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

    out, scope, st = _scope_calls(promoted, model, calls)
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
        (got, want), scope, _ = _scope_calls(promoted, model, calls)
    finally:
        for h in handles:
            h.remove()
    hooked = "hook" in change
    assert scope.direct is not None and scope.direct.calls == (2 if direct else 0 if hooked else 1), scope.direct_why
    assert scope.rehooks == (1 if hooked else 0)
    torch.testing.assert_close(got, want)
    if hooked:
        assert seen == [1, 1]  # the hooked call, and the forward as written


def _three_alike_calls(promoted, wl, cls):
    """``cls`` (a subclass of the workload's model) with the model's weights, called three times
    alike with the softmax card served; each output checked against its own forward's; (scope,
    the card's status)."""
    model = cls()
    model.load_state_dict(wl.get_model().state_dict())
    x = wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
    outs, scope, st = _scope_calls(promoted, model, lambda m: [m(x) for _ in range(3)])
    for o in outs:
        torch.testing.assert_close(o, expected)
    return scope, st


def test_a_scope_whose_graph_breaks_is_called_directly_on_both_sides_of_the_break(promoted, monkeypatch):
    """Dynamo compiles the code after a graph break on its own (a scope compiled around a served
    leaf module breaks there): the direct call runs that code's compiled variant too, under its
    own guards, so the softmax after the break is still served."""
    import sys

    wl = load_workload()
    monkeypatch.setitem(sys.modules, wl.__name__, wl)  # Dynamo imports the module of the class below's base

    class Breaking(type(wl.get_model())):
        def forward(self, x):
            h = self.norm(x)
            torch._dynamo.graph_break()
            return torch.softmax(h, dim=-1)

    scope, st = _three_alike_calls(promoted, wl, Breaking)
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
    import sys

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

    scope, st = _three_alike_calls(promoted, wl, Wrapped)
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
    import sys

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

    outs, scope, st = _scope_calls(promoted, model, calls)
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

    ws, card, wl = _one_card_promoted(tmp_path, "softmax_layers.py", "aten._softmax.default",
                                      (CPU / "softmax_good.cpp").read_text())
    compiles = _count_scope_compiles(monkeypatch)
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model()
    steps = [torch.randn(n, 64) for n in (1, 1, 1)] + [torch.randn(16, 64)]
    with torch.no_grad(), apply(model, ws, only_faster=False) as applied:
        for t in [x, x, *steps, x]:
            torch.testing.assert_close(model(t), ref(t))
        scopes = [applied.scopes[f"layers.{i}"] for i in range(2)]
        st = applied.status()["cards"][0]
        from forge_tui.e2e import scope_notes

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
    ws, card, wl = _one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
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
    ws, _, wl = _one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
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


def test_a_leaf_call_refused_before_is_not_intercepted_again(layer_norm_ws, monkeypatch):
    """A leaf module called at shapes its card was not profiled at (a generation step, another
    resolution) went through the interceptor every call. Once learning is over, a call like one
    that no card served (the same tensors' specs, parameters, attributes, grad mode) counts the
    same refusals and runs the module's own forward, not intercepted; a changed attribute or
    parameter, or another shape, is judged through the interceptor again; the profiled shape is
    still served. Outputs agree with eager's every time."""
    from forge_tui.runtime.leaf import LeafSites as _LeafSites

    wl = _layernorm_workload()
    ws, card = layer_norm_ws
    seen = _count_intercepted(monkeypatch)
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


def _count_checks(monkeypatch) -> list[int]:
    """A list that grows by one at each check of a call against a card's specs (``Guard.mismatch``)."""
    checks: list[int] = []
    real = Guard.mismatch

    def counting(self, tensors):
        checks.append(1)
        return real(self, tensors)

    monkeypatch.setattr(Guard, "mismatch", counting)
    return checks


def test_a_module_card_call_whose_tensors_were_refused_runs_the_original_at_once(promoted, monkeypatch):
    """A module card's call at shapes the card refuses is remembered by its tensors' specs: a like
    call counts the same reason and runs the original forward without the checks. A refusal caused
    by the module's own parameter is not remembered: once the parameter is back, it serves."""
    ws, norm, _ = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    ref = wl.get_model().norm
    checks = _count_checks(monkeypatch)
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


def test_a_refused_call_with_a_keyword_tensor_runs_the_original_at_once(tmp_path, monkeypatch):
    """A module card profiled as ``norm(x, gain=g)``: a call whose first tensor has another shape
    is refused whatever its keyword tensor is; a like call (same first tensor's shape, dtype and
    device, as many arguments) counts the same reason and runs the module's own forward, keyword
    included, without the checks. A call at the card's shapes is served."""
    ws, card, wl = _one_card_promoted(tmp_path, "kwarg_norm.py", "module:GainNorm")
    model, (x, g) = wl.get_model(), wl.get_inputs()
    ref = wl.get_model().norm
    checks = _count_checks(monkeypatch)
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


def test_in_place_trials_time_only_calls_the_kernels_can_serve(promoted, tmp_path, monkeypatch):
    """A model called at other shapes than the profiled ones (a generation loop's steps) is tried
    in place only on the calls its kernels can serve: the module card on calls its specs match, a
    compiled scope on calls like one whose variant served a card. Before, the other calls timed
    the original forward on both sides, the kernel's side with its refusal's cost, and switched
    kernels off that were faster where they serve."""
    ws, norm, sm = promoted
    root = _installed_copy(ws, tmp_path / "ws", [norm.id, sm.id])
    tried = _count_trials(monkeypatch)
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


def test_alike_scopes_stop_sharing_where_dynamo_guards_a_layer_of_its_own(tmp_path):
    """Where the shared copy compiles again for a call like one it compiled (Dynamo guards
    something of that layer's own: here an attribute the forward reads, set apart in one layer),
    the book stops sharing: the later layers compile copies of their own, so one cache never
    holds a variant a layer. Every layer is served and agrees with eager."""
    src = (HERE / "data" / "workloads" / "softmax_layers.py").read_text()
    src = src.replace("        self.proj = nn.Linear(64, 64)\n", "        self.proj = nn.Linear(64, 64)\n        self.t = 1.0\n")
    src = src.replace("return torch.softmax(self.proj(x), dim=-1)", "return torch.softmax(self.proj(x) * self.t, dim=-1)")
    src = src.replace("for _ in range(2))", "for _ in range(3))")
    path = tmp_path / "wl.py"
    path.write_text(src)
    ws, card, wl = _one_card_promoted(tmp_path, path, "aten._softmax.default", (CPU / "softmax_good.cpp").read_text())
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
    assert [s.shared for s in scopes] == [True, True, False] and not book.shared
    assert book.variants.codes and len(book.variants.codes) == 2  # layer 0's and layer 1's
    assert scopes[2].variants == 1 and st["served"] == 3 * 3


def test_an_intercepted_scope_runs_a_call_like_one_that_served_nothing_as_written(promoted, monkeypatch, tmp_path):
    """An intercepted scope (the softmax's, the model) called at a shape its cards were not
    profiled at: the first such call passes the interceptor and serves nothing; a like call (the
    same first tensor's shape and dtype: a decode step after the first) runs as written, its ops
    never intercepted, counted as a fallback of each card; the profiled shape is served still. The
    trial times only calls the kernels can serve."""
    from forge_tui.runtime.apply import UNSERVED_WHY, Guard, Trial

    ws, norm, sm = promoted
    root = _installed_copy(ws, tmp_path / "ws", [sm.id])
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    monkeypatch.setattr(Guard, "__init__", _with_gain(Guard.__init__, 1e6))
    tried = _count_trials(monkeypatch)
    monkeypatch.setattr(Trial, "time_call", lambda self, fn, k: (fn(), 10_000 if k else 30_000))  # kept
    seen = _count_intercepted(monkeypatch)
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


def test_the_bench_bounds_the_forward_by_the_served_cards_own_times(promoted, tmp_path):
    """Beside the bound from isolation, the bench times each card its guard serves, eager's ops
    and the served call on the card's captured inputs in its own process, and bounds the forward
    by what those save (each card's calls a forward times the difference); the forward is held
    to that bound only where it is bound by its device (no graphed times here: isolation's)."""
    import shutil

    from forge_tui import e2e
    from forge_tui.promotion import manifest
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    r = e2e.bench(WORKLOAD, ws, device="cpu", repeats=3, with_compile=False, switch_off=False, only_faster=False)
    assert set(r.own_times) == {norm.id, sm.id} == {c for c, n in r.served.items() if n}
    assert all(e > 0 and o > 0 for e, o in r.own_times.values()), r.own_times
    eager = r.times["eager"].median
    saved = sum(ws.card(c).calls * (e - o) for c, (e, o) in r.own_times.items())
    assert saved == pytest.approx(sum(e2e.own_saved_us(ws, manifest(ws), r.served, eager, r.own_times).values()))
    assert r.own_bound == (pytest.approx(eager / (eager - saved)) if 0 < saved < eager else None)
    assert r.bound_basis == "isolation"
    assert r.to_json()["own_times_us"] == {c: list(v) for c, v in r.own_times.items()}
    assert f"{norm.id}: eager's ops {r.own_times[norm.id][0]:.1f} µs a call" in r.table()
