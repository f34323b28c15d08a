"""Answers: what does one served call cost the host, module card and learned leaf site alike,
next to eager's call of the same module and the kernel's bare launch (its ctypes call on
descriptors already filled)? The difference between served and bare is the runtime's own cost
per call: the guard's checks, the outputs' allocation, the descriptors, the status count.

    python bench/lab/served_host.py [--calls 20000]

CPU only (the repo's CPU candidates, promoted after a real evaluation, on tiny shapes so that the
kernels' own work is small). Prints a table; JSON to $OUT if set.

Answer on the 2-core development machine (2026-12-02, torch 2.13.0+cpu, a shared machine whose
numbers move by 20% between runs): before `b3b2fde` the runtime's own cost was 18.8 µs a call for
the learned leaf site and 7.8 µs for the module card (one run); since, 10.8-13.2 µs and 7.0-10.4 µs
(five runs), where eager's nn.LayerNorm call costs 5.9-9.3 µs in all. On the H200 (the e2e bench's
per-module times, docs/benchmarks.md, seventh session) a served leaf group norm then cost the host
what eager's does, 28-34 µs a call.

Fast path (2026-12-03, night): a learned leaf's settled call specialised to its site
(``_LeafSites._fast``, ``CardKernel.bind``): the leaf's runtime cost 7.7-12.6 µs a call (three
runs), against 13.9-20.8 µs the evening before and 14.5 µs in the same hour before the change.

The module card's call takes the same specialised path since `70f205f`
(``apply._specialised``): its runtime cost 7.4-8.0 µs a call (two runs), against 7.0-10.4 µs
before on 2026-12-02 and 10.1 µs this evening.

Third case (2026-12-03, late): a kernel with a workspace. Before `CardKernel._workspace` every
served call allocated its workspace (a fresh buffer and an aligned view of it): 3.7-6.0 µs a call
on this machine's CPU (three runs, the last column), now paid once per stream. The case's own
kernel (a scalar two-pass softmax) takes 45-60 µs and moves between runs by more than that, so
its "runtime" column (7-15 µs) does not resolve the difference; the allocation's cost is timed
alone.

Fourth answer (2026-12-04): the same case's host time before the launch, the general path
(``CardKernel.__call__``) against ``CardKernel.bind``'s call, which module cards and learned leaf
sites use and which now serves kernels with a workspace too (`36f0923`): 2.94 µs a call before
(one run), 2.50 general and 1.74 bound after (one run), not counting ctypes' conversion of the
nine arguments that the bound call also skips.

Fifth answer (2026-12-05): the module card as the custom op a compiled graph calls
(``--compiled``; the model compiled by inductor around the op). The op's call cost 12.9 µs
(three runs) through the guard's general path against a 5.3 µs bare launch; through the lean path
a settled guard of one output builds (``Guard._build_lean``) 11.5-11.7, of which the dispatcher's
own call of the op is about 3 µs. The compiled forward (the norm, then +1) ran 35.0 µs a call with
the op against 15.8 without it before, 32.6 after: the rest is inductor's code on both sides of an
opaque node, which it no longer fuses.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TIMING = "[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _promote(workload: Path, root: Path, pick, source: str, edit=None):
    from forge_tui.config import parse_config
    from forge_tui.evaluator import Evaluator
    from forge_tui.promotion import promote_kernel
    from forge_tui.workspace import profile_into_workspace

    root.mkdir(parents=True)
    (root / "forge.toml").write_text(TIMING)
    ws, _ = profile_into_workspace(workload, root / "ws", device="cpu", config_path=root / "forge.toml")
    card = next(c for c in ws.cards() if pick(c))
    src = (TESTS / "candidates" / "cpu" / source).read_text()
    if edit is not None:
        src = edit(src)
    cfg = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0,
                                   "max_slowdown": 100.0}})
    with Evaluator(ws.store, ws.cache, cfg, backend="cpu") as ev:
        r = ev.evaluate(card, src)
    if not r.correct:
        raise SystemExit(f"{source} did not pass: {r.reason}")
    promote_kernel(ws, card.id, src, r, by="served_host")
    return ws


def per_call_us(fn, calls: int) -> float:
    """Best of five loops of ``calls`` back-to-back calls, µs a call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1000.0)
    return best


def _pre_launch_us(k, fn, calls: int) -> float:
    """Median over ``calls`` calls of ``k.last_host_ns``, the host's time before the launch, µs."""
    got = []
    for _ in range(calls):
        fn()
        got.append(k.last_host_ns)
    got.sort()
    return got[len(got) // 2] / 1000.0


def bare_launch(applied, x_like):
    """The kernel's ctypes call alone, on descriptors filled once (what no runtime can avoid)."""
    guard = next(iter(applied.guards.values()))
    k = guard.kernel()
    outs = k._outputs(x_like)
    for i, t in enumerate(x_like):
        k._ins[i].data = t.data_ptr()
    for i, t in enumerate(outs):
        k._outs[i].data = t.data_ptr()
    n_in, n_out, n_sc = k._n
    return lambda: k.lib.call_raw(k._ins, n_in, k._outs, n_out, k._scs, n_sc, None, None), outs


def workspace_case(tmp: Path, calls: int) -> dict:
    """A served op card whose kernel asks for a workspace (the repo's softmax_workspace.cpp
    without the marker check that makes it refuse a buffer it wrote before): the guard's served
    call, the bare launch on a kept workspace, and what allocating the workspace (an aligned view
    of a fresh buffer, what every call paid before ``CardKernel._workspace``) costs on its own."""
    import torch

    from forge_tui.kernel_abi import alloc_workspace

    ws = _promote(TESTS / "data/workloads/runtime_model.py", tmp, lambda c: c.target == "aten._softmax.default",
                  "softmax_workspace.cpp", lambda src: src.replace("if (marker == MARKER) return 9;", ""))
    wl = _load(TESTS / "data/workloads/runtime_model.py")
    from forge_tui.runtime.apply import apply

    model = wl.get_model()
    x = torch.randn(16, 256)
    eager = per_call_us(lambda: torch.softmax(x, dim=-1), calls)
    with apply(model, ws, only_faster=False) as applied:
        guard = next(iter(applied.guards.values()))
        if guard.serve([x]) is None:
            raise SystemExit("the workspace kernel was not served")
        served = per_call_us(lambda: guard.serve([x]), calls)
        k = guard.kernel()
        outs = k._outputs([x])
        k._ins[0].data, k._outs[0].data = x.data_ptr(), outs[0].data_ptr()
        scratch = k._workspace("cpu", None)
        n_in, n_out, n_sc = k._n
        launch = per_call_us(lambda: k.lib.call_raw(k._ins, n_in, k._outs, n_out, k._scs, n_sc, None, scratch), calls)
        alloc = per_call_us(lambda: alloc_workspace(k._ws_bytes or 0, "cpu"), calls)
        # the host's time before the launch (the kernel's own, 45-60 µs here, would hide it):
        # CardKernel.__call__ (the general path) against CardKernel.bind's call
        general = _pre_launch_us(k, lambda: k([x], True, 0), calls)
        bound = k.bind(0)
        bound_us = _pre_launch_us(k, lambda: bound([x], time.perf_counter_ns()), calls) if bound else float("nan")
    return {"case": "op card with a workspace (softmax)", "eager_us": eager, "served_us": served,
            "bare_launch_us": launch, "runtime_us": served - launch, "workspace_alloc_us": alloc,
            "kernel_call_us": general, "kernel_bound_us": bound_us}


def compiled_case(tmp: Path, calls: int) -> dict:
    """The RMSNorm module card as the custom op of a model compiled by inductor: the op called
    alone, the bare launch, and the compiled forward (the norm, then +1) with and without forge."""
    import torch

    from forge_tui.runtime.apply import Mode, apply, module_inputs
    from forge_tui.runtime.custom_op import custom_op as _custom_op

    ws = _promote(TESTS / "data/workloads/runtime_model.py", tmp, lambda c: c.kind == "module", "rmsnorm_good.cpp")
    sys.path.insert(0, str(TESTS / "data/workloads"))  # Dynamo traces the model's class from its module
    import runtime_model as wl

    model, x = wl.get_model(), wl.get_inputs()[0]
    mod = model.norm
    plain = torch.compile(lambda t: mod(t) + 1)
    for _ in range(5):
        plain(x)
    without = per_call_us(lambda: plain(x), calls // 4)
    torch._dynamo.reset()
    with apply(model, ws, mode=Mode.TORCH_COMPILE, only_faster=False) as applied:
        guard = next(iter(applied.guards.values()))
        op = _custom_op(guard)
        ins = module_inputs(mod, (x,), {}, guard.consts)
        for _ in range(20):
            op(ins)
        op_us = per_call_us(lambda: op(ins), calls)
        bare, _keep = bare_launch(applied, ins)
        launch = per_call_us(bare, calls)
        with_forge = torch.compile(lambda t: mod(t) + 1)
        for _ in range(5):
            with_forge(x)
        with_us = per_call_us(lambda: with_forge(x), calls // 4)
        lean = guard._lean is not None
    torch._dynamo.reset()
    return {"case": "module card as a compiled graph's op", "eager_us": op_us, "served_us": op_us,
            "bare_launch_us": launch, "runtime_us": op_us - launch, "lean": lean,
            "compiled_with_us": with_us, "compiled_without_us": without}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--compiled", action="store_true", help="the compiled graph's custom op alone (fifth answer)")
    a = p.parse_args()
    if a.compiled:
        import torch

        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            r = compiled_case(Path(tmp) / "compiled", a.calls)
        print(f"op {r['served_us']:.2f} µs a call (lean path: {r['lean']}), bare launch {r['bare_launch_us']:.2f}, "
              f"runtime {r['runtime_us']:.2f}; compiled forward {r['compiled_with_us']:.2f} with forge, "
              f"{r['compiled_without_us']:.2f} without")
        out = os.environ.get("OUT")
        if out:
            Path(out, "served_host_compiled.json").write_text(json.dumps(r, indent=1))
        return
    import torch

    from forge_tui.runtime.apply import apply, module_inputs

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp2, torch.no_grad():
        cases = [
            ("leaf site (nn.LayerNorm, op card)", TESTS / "data/workloads/layernorm.py",
             lambda c: c.target == "aten.native_layer_norm.default", "layernorm_twopass.cpp"),
            ("module card (RMSNorm)", TESTS / "data/workloads/runtime_model.py",
             lambda c: c.kind == "module", "rmsnorm_good.cpp"),
        ]
        for k, (name, wl_path, pick, src) in enumerate(cases):
            ws = _promote(wl_path, Path(tmp) / str(k), pick, src)
            wl = _load(wl_path)
            model, x = wl.get_model(), wl.get_inputs()[0]
            mod = model.norm
            eager = per_call_us(lambda mod=mod, x=x: mod(x), a.calls)
            with apply(model, ws, only_faster=False) as applied:
                for _ in range(10):
                    mod(x)
                served_n = applied.status()["cards"][0]["served"]
                if served_n != 10:
                    raise SystemExit(f"{name}: {served_n} of 10 calls served")
                served = per_call_us(lambda mod=mod, x=x: mod(x), a.calls)
                guard = next(iter(applied.guards.values()))
                ins = module_inputs(mod, (x,), {}, guard.consts) if guard.sig.kind == "module" else \
                    [x, mod.weight, mod.bias]
                bare, _keep = bare_launch(applied, ins)
                launch = per_call_us(bare, a.calls)
            rows.append({"case": name, "eager_us": eager, "served_us": served, "bare_launch_us": launch,
                         "runtime_us": served - launch})
    rows.append(workspace_case(Path(tmp2), a.calls))
    print(f"{'case':36s} {'eager':>8s} {'served':>8s} {'bare':>8s} {'runtime':>8s}  (µs a call)")
    for r in rows:
        print(f"{r['case']:36s} {r['eager_us']:8.2f} {r['served_us']:8.2f} {r['bare_launch_us']:8.2f} "
              f"{r['runtime_us']:8.2f}" + (f"  (a fresh workspace: {r['workspace_alloc_us']:.2f}; before the "
                                           f"launch: {r['kernel_call_us']:.2f} general, {r['kernel_bound_us']:.2f} "
                                           "bound)" if "workspace_alloc_us" in r else ""))
    out = os.environ.get("OUT")
    if out:
        Path(out, "served_host.json").write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
