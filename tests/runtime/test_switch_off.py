"""``forge bench``'s switch-off: the forward timed with and without forge's kernels, op by op,
compiled and in CUDA graphs, and the kernels that slow it switched off in the manifest."""

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from runtime_helpers import (
    WORKLOAD,
    load_workload,
    promoted_workspace,
    slow_bound_calls,
    stand_in_timer,
)

from forge_tui.cli import main
from forge_tui.e2e import BenchOptions, bounds, driver, graphs, own_process, switch_off
from forge_tui.errors import ForgeError
from forge_tui.promotion import manifest
from forge_tui.runtime.apply import Mode, apply
from forge_tui.runtime.kernel import CardKernel


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_bench_times_four_ways_and_switches_off_a_kernel_that_slows_the_forward(promoted, monkeypatch, capsys, tmp_path):
    """forge bench on the CPU: eager and eager + forge (torch.compile skipped to keep the test
    short), outputs checked; a kernel made slow (5 ms a call) is switched off in the manifest."""
    import shutil

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
    slow_bound_calls(monkeypatch, lambda k: k.out_specs[0].shape == list(norm.outputs[0].shape) and
                      len(k.out_specs) == 1 and len(k.out_specs) == len(norm.outputs))
    from forge_tui.e2e import bench

    r = bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, with_compile=False, only_faster=False))
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
    r = bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager"))
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

    stand_in_timer(monkeypatch, lambda name: [v * 1.05 for v in base] if name == "compile+forge" else list(base))
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, only_faster=False, compile_backend="aot_eager"))
    assert r.times["compile"].q3 > r.times["compile+forge"].q1  # overlapping quartiles
    key = f"{norm.id} (under torch.compile)"
    assert key in r.switched_off and "0.952x" in r.switched_off[key], r.switched_off
    assert norm.id not in r.switched_off  # eager + forge was level with eager: kept there
    # the torch.compile verdict alone (e2e_bench's final four ways): nothing off op by op
    shutil.copytree(src.root, tmp_path / "ws2")
    ws2 = Workspace.open(tmp_path / "ws2")
    stand_in_timer(monkeypatch, lambda name: [200.0] * 5 if name == "eager+forge" else
                    [v * 1.05 for v in base] if name == "compile+forge" else list(base))
    r = e2e.bench(WORKLOAD, ws2, BenchOptions(device="cpu", repeats=5, only_faster=False,
                                              compile_backend="aot_eager", switch_off=False, switch_off_compile=True))
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
    stand_in_timer(monkeypatch, lambda name: [v * 0.8 for v in base] if name == "compile+forge" else list(base))
    asked: list[tuple] = []
    limits: list[float] = []

    def own(answer):
        def fresh(spec, ws, dev, options, timeout_s):
            asked.append((spec, ws.root, dev, options.compile_backend))
            limits.append(timeout_s)
            return answer
        return fresh

    slower = ({"compile": list(base), "compile+forge": [v * 1.1 for v in base]}, {norm.id: 1})
    faster = ({"compile": list(base), "compile+forge": [v * 0.9 for v in base]}, {norm.id: 1})
    for n, (answer, off) in enumerate(((slower, "0.909x"), (faster, None), ("it did not finish in 900 s", "900 s"))):
        shutil.copytree(src.root, tmp_path / f"ws{n}")
        ws = Workspace.open(tmp_path / f"ws{n}")
        monkeypatch.setattr(driver, "fresh_compile_pair", own(answer))
        r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, only_faster=False,
                                                 compile_backend="aot_eager", switch_off=False,
                                                 switch_off_compile=True))
        assert asked[-1] == (WORKLOAD, ws.root, "cpu", "aot_eager")
        assert r.speedups["compile+forge/compile"].median == pytest.approx(1.25)
        if off is None:
            assert key not in r.switched_off and r.speedups[e2e.FRESH_COMPILE].median == pytest.approx(1 / 0.9)
            assert not manifest(ws).entries[norm.id].compile_disabled_reason
            assert "in a process of their own: 1.111x" in r.table()
        else:
            assert off in r.switched_off[key] and "process of its own" in r.switched_off[key], r.switched_off
            assert manifest(ws).entries[norm.id].compile_disabled_reason == r.switched_off[key]
    assert limits == [own_process.FRESH_TIMEOUT_S] * 3
    # without the check (or where this process already found them slower) no process is started
    n = len(asked)
    shutil.copytree(src.root, tmp_path / "ws-no-check")
    e2e.bench(WORKLOAD, Workspace.open(tmp_path / "ws-no-check"), BenchOptions(device="cpu", repeats=5,
                                                                               only_faster=False,
                                                                               compile_backend="aot_eager",
                                                                               switch_off=False,
                                                                               switch_off_compile=True,
                                                                               own_process_check=False))
    assert len(asked) == n
    # a deadline: the process gets what is left before it; with too little left it is not started,
    # and the kernels go off in compiled models, unconfirmed

    for k, (left, started) in enumerate(((120.0, True), (3.0, False))):
        shutil.copytree(src.root, tmp_path / f"ws-deadline{k}")
        ws = Workspace.open(tmp_path / f"ws-deadline{k}")
        monkeypatch.setattr(driver, "fresh_compile_pair", own(faster))
        before = len(asked)
        r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, only_faster=False,
                                                 compile_backend="aot_eager", switch_off=False,
                                                 switch_off_compile=True, own_process_deadline=time.time() + left))
        assert (len(asked) > before) == started
        if started:
            assert 100.0 < limits[-1] <= 120.0 and key not in r.switched_off
        else:
            assert "were left for it before the run's deadline" in r.switched_off[key], r.switched_off


def test_a_process_of_their_own_times_compile_and_compile_with_forge(promoted):
    """``fresh_compile_pair`` starts ``python -m forge_tui.compile_pair``: the model built afresh,
    both compiled variants timed interleaved, the kernels served in the compiled forwards."""
    from forge_tui.e2e.own_process import fresh_compile_pair

    ws, norm, _ = promoted
    options = BenchOptions(repeats=3, warmup=1, compile_backend="aot_eager", only_faster=False)
    got = fresh_compile_pair(WORKLOAD, ws, "cpu", options)
    assert not isinstance(got, str), got
    raw, served = got
    assert sorted(raw) == ["compile", "compile+forge"] and all(len(v) == 3 and min(v) > 0 for v in raw.values())
    assert served[norm.id] >= 3  # its warm-up and timed forwards
    # a workspace it cannot read: why, in one line, not an exception
    why = fresh_compile_pair(WORKLOAD, SimpleNamespace(root=ws.root / "missing"), "cpu", options)
    assert isinstance(why, str) and "status 1" in why and "\n" not in why


def test_op_cards_sharing_an_intercepted_scope_are_left_out_together():
    """Leaving out one op card of a scope leaves the scope intercepted: the switch-off tries the
    scope's op cards as one unit; module cards stay units of their own."""
    from types import SimpleNamespace

    from forge_tui.e2e.switch_off import switch_off_units

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

    stand_in_timer(monkeypatch, samples)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=len(forge_us), with_compile=False,
                                             only_faster=False))
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

    stand_in_timer(monkeypatch, samples)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=5, with_compile=False, only_faster=False))
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
    from forge_tui.workspace import Workspace

    src, norm, sm = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, switch_off=False,
                                             graphs=True))
    assert "CUDA graphs: not on this device" in r.notes and "eager (graph)" not in r.times

    captured = []

    def stand_in(run, warmup=3):
        captured.append("forward" in run.args[0].norm.__dict__)  # is forge's kernel in the captured model?
        return run, run()

    monkeypatch.setattr(graphs, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs, "cuda_graphed", stand_in)
    samples = {"eager (graph)": 100.0, "eager+forge (graph)": 80.0, "eager": 100.0, "eager+forge": 200.0,
               "with": 200.0, "without": 100.0, "forge": 200.0}
    stand_in_timer(monkeypatch, lambda name: [samples.get(name, 150.0)] * 3)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, only_faster=False,
                                             graphs=True))
    assert captured[:2] == [False, True]  # eager's graph: the model as it is; forge's: the kernels applied
    assert {k for k in r.switched_off if "CUDA graphs" not in k} == {norm.id, sm.id}  # op by op, slower: off ...
    assert set(graphs.GRAPH_VARIANTS) <= set(r.times)  # ... and still in forge's graph
    assert r.outputs_agree["eager+forge (graph)"] is None
    assert abs(r.speedups["graphs: forge/eager"].median - 1.25) < 0.01
    assert "in CUDA graphs, eager + forge vs eager: 1.250x" in r.table()

    def wrong_graph(run, warmup=3):
        out = run()
        return run, (out * 2 if "forward" in run.args[0].norm.__dict__ else out)

    monkeypatch.setattr(graphs, "cuda_graphed", wrong_graph)
    shutil.copytree(src.root, tmp_path / "ws2")  # the kernels not switched off
    ws = Workspace.open(tmp_path / "ws2")
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, switch_off=False,
                                             graphs=True))
    assert r.outputs_agree["eager+forge (graph)"] and "eager+forge (graph)" in r.forge_mismatches()

    calls = []

    def refuses_second(run, warmup=3):
        calls.append(1)
        if len(calls) == 2:
            raise ForgeError("RuntimeError: operation not permitted when stream is capturing")
        return run, run()

    monkeypatch.setattr(graphs, "cuda_graphed", refuses_second)

    class NoPieceEither:
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_piece_capturer", NoPieceEither)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, switch_off=False,
                                             graphs=True))
    assert not set(graphs.GRAPH_VARIANTS) & set(r.times) and "graphs: forge/eager" not in r.speedups
    assert not set(graphs.GRAPH_VARIANTS) & set(r.outputs_agree)
    assert any("whole forward could not be captured (RuntimeError: operation not permitted" in n for n in r.notes)
    assert any("not even in pieces: no piece of the forward could be captured" in n for n in r.notes), r.notes

    # the whole forward cannot be captured but its modules can: both graphed variants run in pieces
    from test_pieces import StandIn

    calls.clear()
    monkeypatch.setattr(graphs, "_piece_capturer", StandIn)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, switch_off=False,
                                             graphs=True))
    assert set(graphs.GRAPH_VARIANTS) <= set(r.times) and "graphs: forge/eager" in r.speedups
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

    real_switch_off = driver.switch_off_slower

    def counted_switch_off(*a, **kw):
        gc.collect()
        alive_at_capture.append(sum(r() is not None for r in compiled))
        return real_switch_off(*a, **kw)

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(graphs, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs, "cuda_graphed", stand_in)
    monkeypatch.setattr(driver, "switch_off_slower", counted_switch_off)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=2, warmup=1, compile_backend="eager", graphs=True))
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
    from forge_tui.runtime.passthrough import Passthrough
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
        own = model.__dict__.get("forward")  # the softmax scope's, not the pass-through switch's
        if own is not None and not isinstance(getattr(own, "__self__", None), Passthrough):
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

    monkeypatch.setattr(graphs, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs, "cuda_graphed", stand_in)
    monkeypatch.setattr(driver, "Timer", Timer)
    monkeypatch.setattr(switch_off, "Timer", Timer)
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, only_faster=False,
                                             graphs=True))
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


def test_the_bench_counts_garbage_collections_by_variant_with_the_setup_frozen():
    import gc

    from forge_tui.e2e.memory import GcPauses

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

    from forge_tui.timing import Timer

    class Undo:
        def undo(self):
            pass

    monkeypatch.setattr(switch_off, "apply", lambda *a, **k: Undo())
    frozen: list[int] = []

    class Wl:
        def run(self, model, inputs):
            frozen.append(gc.get_freeze_count())
            return model(*inputs)

    model = torch.nn.Linear(4, 4)
    switch_off._time_against(Wl(), [torch.randn(2, 4)], None, "cpu", Timer("cpu", warmup=1, repeats=3), True,
                      model, model, [], ("with", "without"))
    assert frozen and min(frozen) > 0
    assert gc.get_freeze_count() == 0


def test_each_switch_off_unit_is_timed_against_a_fresh_copy_with_every_kernel(monkeypatch):
    """Each unit left out is timed against its own fresh copy of the model with every kernel, built
    and applied as the copy without it is, and undone after: no copy carries what earlier units
    ran on it (on the H200 one kept for every unit ran 200-460 µs slower than the bench's own)."""
    from types import SimpleNamespace

    from forge_tui.timing import Stats

    made: list[tuple[object, tuple[str, ...]]] = []  # the objects themselves: kept alive, their ids unique
    undone: list[object] = []

    class Applied:
        def __init__(self, model, cards):
            self.model = model
            made.append((model, tuple(cards)))

        def undo(self):
            undone.append(self.model)

    monkeypatch.setattr(switch_off, "apply", lambda model, ws, cards=(), **k: Applied(model, cards))
    bases: list[object] = []
    same = Stats.from_samples([100.0, 101.0, 102.0])

    def timed(wl, inputs, ws, dev, timer, only_faster, base, model, cards, names):
        bases.append(base)
        return same, same, Stats.from_samples([1.0, 1.0, 1.0])

    monkeypatch.setattr(switch_off, "_time_against", timed)
    served = ["mod-a", "mod-b", "mod-c"]
    man = SimpleNamespace(entries={c: SimpleNamespace(signature=SimpleNamespace(kind="module", module_paths=[c]))
                                   for c in served})
    applied = SimpleNamespace(status=lambda: {"cards": [{"card": c, "served": 1} for c in served]})
    raw = {"eager": [100.0, 100.0, 100.0], "eager+forge": [50.0, 50.0, 50.0]}
    stats = {k: Stats.from_samples(v) for k, v in raw.items()}
    out, _ = switch_off.switch_off_slower(None, torch.nn.Linear(2, 2), [], None, man, applied, "cpu", None, True, stats, raw)
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

    from forge_tui.timing import Stats

    def st(median):
        return Stats.from_samples([median - 10.0, median, median + 10.0])

    monkeypatch.setattr(switch_off, "apply", lambda model, ws, cards=(), **k: SimpleNamespace(undo=lambda: None))
    committed: list[list[str]] = []
    monkeypatch.setattr(switch_off, "commit_manifest", lambda ws, man, kind, subject, lines, cards: committed.append(cards))
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

        monkeypatch.setattr(switch_off, "_time_against", timed)
        man = SimpleNamespace(entries={c: SimpleNamespace(signature=SimpleNamespace(kind="module", module_paths=[c]),
                                                          enabled=True, disabled_reason=None) for c in served})
        applied = SimpleNamespace(status=lambda: {"cards": [{"card": c, "served": 1} for c in served]})
        raw = {"eager": [5000.0] * 3, "eager+forge": [4100.0] * 3}
        stats = {k: Stats.from_samples(v) for k, v in raw.items()}
        units: list[dict] = []
        out, _ = switch_off.switch_off_slower(None, torch.nn.Linear(2, 2), [], None, man, applied, "cpu", None, True,
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
    assert bounds.promised_us(ws, man, 1000.0) == {"rms": pytest.approx(150.0)}
    one = Stats.from_samples([1000.0])
    r = e2e.BenchResult("cpu", {"eager": one}, {}, {}, None, {"rms": 3}, units=[
        {"cards": ["rms"], "with_us": 800.0, "without_us": 900.0, "promised_us": 150.0},
        {"cards": ["gelu"], "with_us": 800.0, "without_us": 790.0, "promised_us": None}])
    table = r.table()
    assert "in the model rms saved 100 µs a forward (800 with it, 900 without); isolation promised 150" in table
    assert "in the model gelu saved -10 µs a forward (800 with it, 790 without)\n" in table + "\n"
    assert r.to_json()["units"][0]["promised_us"] == 150.0


def test_the_final_switch_off_measures_again_when_its_quartiles_straddle_one(promoted, monkeypatch):
    """The kernels left, together, against eager: a paired ratio whose median is below 1 but whose
    upper quartile is above it is measured again, twice as long, and that decides: kept when the
    second measurement is faster (its ratio reported), switched off, saying so, when it is not;
    a ratio below 1 in both quartiles switches off without measuring again."""
    import shutil
    import tempfile

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

        monkeypatch.setattr(switch_off, "_time_against", time_against)
        out, after = switch_off.switch_off_slower(None, None, None, ws, man, Applied(), "cpu", Timer("cpu", repeats=10),
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
    r = e2e.bench(WORKLOAD, ws, BenchOptions(device="cpu", repeats=3, with_compile=False, switch_off=False,
                                             only_faster=False))
    assert set(r.own_times) == {norm.id, sm.id} == {c for c, n in r.served.items() if n}
    assert all(e > 0 and o > 0 for e, o in r.own_times.values()), r.own_times
    eager = r.times["eager"].median
    saved = sum(ws.card(c).calls * (e - o) for c, (e, o) in r.own_times.items())
    assert saved == pytest.approx(sum(bounds.own_saved_us(ws, manifest(ws), r.served, eager, r.own_times).values()))
    assert r.own_bound == (pytest.approx(eager / (eager - saved)) if 0 < saved < eager else None)
    assert r.bound_basis == "isolation"
    assert r.to_json()["own_times_us"] == {c: list(v) for c, v in r.own_times.items()}
    assert f"{norm.id}: eager's ops {r.own_times[norm.id][0]:.1f} µs a call" in r.table()


def test_generate_bench_switches_kernels_off_under_compile_unless_faster_at_every_batch(promoted, tmp_path):
    """forge bench --generate: the kernels torch.compile + forge served are switched off for
    compiled models unless its N-token generations were faster than torch.compile's at every batch
    timed (the paired rounds' times, given here: the verdict, not the machine, is under test); eager
    models keep them, and the decision is a commit of the workspace."""
    import shutil

    from forge_tui.generation.bench import switch_off_under_compile
    from forge_tui.workspace import Workspace

    src, norm, _ = promoted
    shutil.copytree(src.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    faster = ([10.0, 10.0, 10.0], [8.0, 8.5, 9.0])
    assert switch_off_under_compile(ws, [norm.id], {1: faster, 8: faster}, 8, "cpu") == {}
    assert not manifest(ws).entries[norm.id].compile_disabled_reason
    # faster at batch 1, slower at batch 8 (10/12, 10/12.5, 10/9: a median of 0.833)
    off = switch_off_under_compile(ws, [norm.id, "op-not-promoted"],
                                   {1: faster, 8: ([10.0, 10.0, 10.0], [12.0, 12.5, 9.0])}, 8, "cpu")
    assert list(off) == [norm.id]
    assert off[norm.id] == ("torch.compile + forge's 8-token generations were not faster than torch.compile's: "
                            "0.833x [0.817, 0.972] at batch 8 (its speed over torch.compile's, paired rounds, "
                            "forge bench --generate, cpu)")
    assert manifest(ws).entries[norm.id].compile_disabled_reason == off[norm.id]
    with ws.git() as repo:
        message = repo.log()[0][1]
    assert message.startswith("switch off 1 kernel under torch.compile\n") and "Forge-Event: switch-off" in message
    model = load_workload().get_model()
    with apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
        assert "switched off under torch.compile" in applied.skipped[norm.id]
    with apply(model, ws, only_faster=False) as applied:
        assert norm.id in applied.guards
