"""What the runtime's tests share: the workloads and kernels they promote (session fixtures), and
the helpers that count what the runtime does."""

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from forge_tui.config import parse_config
from forge_tui.e2e import driver, switch_off
from forge_tui.evaluator import Evaluator
from forge_tui.promotion import promote_kernel
from forge_tui.runtime import placement
from forge_tui.runtime.apply import Guard, apply
from forge_tui.runtime.kernel import CardKernel
from forge_tui.workspace import profile_into_workspace

HERE = Path(__file__).resolve().parent.parent


WORKLOAD = HERE / "data" / "workloads" / "runtime_model.py"


CPU = HERE / "candidates" / "cpu"


CFG = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}})


def load_workload():
    spec = importlib.util.spec_from_file_location("runtime_model", WORKLOAD)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_BUILT: dict[str, Any] = {}
"""The workspaces the runtime's tests share, built once in a process (``shared``)."""


def shared(name: str, build: Callable[[], Any]) -> Any:
    """``build()``'s workspace, built at the first call with ``name`` in this process: the test
    files of one worker share it (each file's fixture hands it on)."""
    if name not in _BUILT:
        _BUILT[name] = build()
    return _BUILT[name]


def promoted_workspace(tmp_path_factory):
    """A workspace with the model's RMSNorm (module card) and softmax (op card) promoted, each after
    a real evaluation of a real kernel: (workspace, the RMSNorm card, the softmax card). Their
    speedups are recorded as measured at 2x eager for the RMSNorm and 0.5x for the softmax (its
    kernel computes in double precision), whatever this machine's load made of the real timing:
    which kernels ``apply`` uses by default must not depend on it."""

    def build():
        ws, norm, sm = norm_and_softmax_promoted(WORKLOAD, tmp_path_factory.mktemp("runtime"))
        measured_speedups(ws.root, {norm.id: 2.0, sm.id: 0.5})
        return ws, norm, sm

    return shared("promoted", build)


def norm_and_softmax_promoted(workload: Path, root: Path):
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


def eager_output(wl, x):
    m = wl.get_model().to(x.dtype)
    return m(x)


def with_gain(init, gain_us):
    def patched(self, *a, **k):
        init(self, *a, **k)
        self.gain_us = gain_us

    return patched


def installed_copy(ws, root: Path, card_ids) -> Path:
    """A copy of ``ws`` at ``root`` whose cards ``card_ids`` measured 2x eager: installed whatever
    the fixture's timing said (its double-precision softmax is slower than eager)."""
    import shutil

    shutil.copytree(ws.root, root)
    measured_twice_as_fast(root, card_ids)
    return root


def measured_twice_as_fast(root: Path, card_ids) -> None:
    """Record the promoted kernels of ``card_ids`` in the workspace at ``root`` as measured 2x
    eager, for tests whose subject is not the kernel's speed: the fixtures' timing runs on a
    loaded CI machine, where a kernel near eager's speed (the CPU layer norm, 1.2-1.6x on a quiet
    one) can measure slower and would not be used."""
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    for cid in card_ids:
        data["entries"][cid]["evidence"]["speedup_vs_eager"] = 2.0
    path.write_text(json.dumps(data))


def measured_speedups(root: Path, speedups: dict[str, float]) -> None:
    """Record the promoted kernels of the workspace at ``root`` as measured at ``speedups`` (card ->
    eager's time over the kernel's), for tests that need one kernel faster than eager and another
    slower whatever the fixture's timing on a loaded machine said."""
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    for cid, speedup in speedups.items():
        data["entries"][cid]["evidence"]["speedup_vs_eager"] = speedup
    path.write_text(json.dumps(data))


class FakeClock:
    """``time.perf_counter_ns`` for tests whose subject is a decision taken on timings (the guard's
    dispatch check, eager's own call timed in the kernel's place), not a speed: each read advances
    it by ``step_ns``, and ``spend(seconds)`` by a call that long (where the test would sleep), so
    that the machine's load cannot change what the runtime measures."""

    def __init__(self, step_ns: int = 1000) -> None:
        self.now = 0
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


def fake_clock(monkeypatch, step_ns: int = 1000) -> FakeClock:
    """A ``FakeClock`` in the place of ``time.perf_counter_ns`` for the rest of the test."""
    clock = FakeClock(step_ns)
    monkeypatch.setattr(time, "perf_counter_ns", clock)
    return clock


def count_trials(monkeypatch) -> list[Any]:
    """The trials (``Trial``) of the calls timed in place from now on, one entry a call."""
    from forge_tui.runtime.apply import Trial

    tried: list[Any] = []
    real = Trial.run

    def run(self, with_kernel, without):
        tried.append(self)
        return real(self, with_kernel, without)

    monkeypatch.setattr(Trial, "run", run)
    return tried


def slow_bound_calls(monkeypatch, which) -> None:
    """The specialised calls (``CardKernel.bind``, the fast paths) of the kernels ``which``
    accepts take 5 ms more, as ``__call__`` patched to sleep does for the general path."""

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


def stand_in_timer(monkeypatch, samples):
    """The bench's Timer replaced: each callable runs once (the kernels serve, so they are counted)
    and its samples are ``samples(name)`` (nothing depends on this machine's load)."""
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

    monkeypatch.setattr(driver, "Timer", Timer)
    monkeypatch.setattr(switch_off, "Timer", Timer)


def count_intercepted(monkeypatch) -> list[str]:
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


def edited_copy(src, tmp_path, card_id, **signature):
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

# ---- the served call's fast paths ----------------------------------------------------------------
def with_workspace_softmax(promoted, tmp_path):
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


def layernorm_workload():
    """tests/data/workloads/layernorm.py, imported."""
    spec = importlib.util.spec_from_file_location("layernorm_wl", HERE / "data" / "workloads" / "layernorm.py")
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    return wl


def layer_norm_workspace(tmp_path_factory):
    """nn.LayerNorm as a leaf module: its one op, native_layer_norm, is an op card scoped to it
    (the module returns the first of the op's three outputs), promoted after a real evaluation."""
    return shared("layer_norm", lambda: _layer_norm_promoted(tmp_path_factory.mktemp("leaf")))


def _layer_norm_promoted(root):
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
    measured_twice_as_fast(ws.root, [card.id])
    return ws, card


def one_card_promoted(tmp_path, workload: "str | Path", target: str, src: str | None = None):
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


EPS = [1e-5]


class GlobalEps(torch.nn.LayerNorm):
    """A layer norm whose forward reads a global: no module attribute says the call changed."""

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, EPS[0])


def layer_norm_model():
    wl = layernorm_workload()
    return wl.get_model(), wl.get_inputs()[0]


def square_workspace(tmp_path_factory):
    """tests/data/workloads/leaf_mul.py: `m(x, x)`, its `mul` card of one input promoted."""
    return shared("square", lambda: _square_promoted(tmp_path_factory.mktemp("square")))


def _square_promoted(root):
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


class PlusOne(TorchFunctionMode):
    """A user's mode that changes what layer_norm returns (as a fake-quantisation mode would)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.nn.functional.layer_norm else out

STRIDE_MISS, SHAPE_MISS = "input 1: strides (2,)", "input 0: shape (4, 256)"


def settle(applied, call, path="norm", calls=40):
    """Run ``call()`` until the leaf at ``path`` serves through its fast path; the calls made."""
    leaf = applied.leaves[path]
    for n in range(1, calls + 1):
        call()
        if leaf.fast is not None:
            return n
    raise AssertionError(f"no fast path after {calls} calls")


def scope_calls(promoted, model, calls):
    """(outputs of ``calls(model)``, the root scope) with the softmax card served in the model's
    compiled root scope."""
    ws, _, sm = promoted
    with torch.no_grad(), apply(model, ws, cards=[sm.id], only_faster=False) as applied:
        outs = calls(model)
        scope = applied.scopes[""]
        st = {c["card"]: c for c in applied.status()["cards"]}
    return outs, scope, st[sm.id]


def count_scope_compiles(monkeypatch) -> list[int]:
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


def three_alike_calls(promoted, wl, cls):
    """``cls`` (a subclass of the workload's model) with the model's weights, called three times
    alike with the softmax card served; each output checked against its own forward's; (scope,
    the card's status)."""
    model = cls()
    model.load_state_dict(wl.get_model().state_dict())
    x = wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
    outs, scope, st = scope_calls(promoted, model, lambda m: [m(x) for _ in range(3)])
    for o in outs:
        torch.testing.assert_close(o, expected)
    return scope, st


def count_checks(monkeypatch) -> list[int]:
    """A list that grows by one at each check of a call against a card's specs (``Guard.mismatch``)."""
    checks: list[int] = []
    real = Guard.mismatch

    def counting(self, tensors):
        checks.append(1)
        return real(self, tensors)

    monkeypatch.setattr(Guard, "mismatch", counting)
    return checks
