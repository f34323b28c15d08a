"""Answers: what does serving the decoder's attention chain cost the host, and what does it save,
by each way of serving it? And which configuration of the generated chain kernel is fastest?

The first H200 run of chain cards (2026-12-01, e2e_bench decoder) served the attention's scale,
mask, fp32 softmax and cast (23% of the forward) through the interceptor and the forward got
5.7 ms slower, though the kernel ran 3.5x eager in isolation. This probe, on the bundled decoder:

1. profiles it into a temporary workspace, evaluates the attention chain card's generated kernel
   in several configurations (the evaluator's times, isolated, cold L2) and the RMSNorm module
   card's first choice, and promotes the fastest of each;
2. times the whole forward, interleaved (paired medians against eager), with: the RMSNorm alone;
   RMSNorm and the chain through the interceptor; RMSNorm and the chain in compiled scopes
   (graph.py); and, for each, the forward's host time (the call's return, the device not waited
   for, after a synchronise);
3. times one attention call on the host: eager, its forward under torch.compile's "eager"
   backend (Dynamo's torch-level graph), AOTAutograd's aten graph as forge compiles it (no card),
   the same with the chain replaced, and the interceptor with nothing to serve.

    python bench/lab/chain_scope.py [--configs N] [--repeats 20]
    python bench/lab/chain_scope.py --sweep-only --variants   # 1. alone, with source variants
    python bench/lab/chain_scope.py --device cpu      # tiny_decoder, a dry run of the procedure

Prints tables; JSON to $OUT/chain_scope.json if $OUT is set.

Answer on the H200 (2026-12-01 22:40, torch 2.11.0+cu130, commit after a41f0d6; one run;
docs/runs/data/2026-12-01-s4/):
- The chain kernel is not the problem but is far from its floor: every configuration ran 145-172 µs
  (3.0-3.5x eager's 529 µs, 0.78-1.11x torch.compile's), against about 48 µs for its bytes. The
  configuration barely matters, so something they share bounds it (two expf and a division per
  element, recomputed in each of three phases, is the first suspect; not measured apart).
- The host is. One eager op costs 10.8 µs of host time on this machine; one attention call 663 µs
  on the host (931 µs waited for). Under the interceptor with nothing to serve it costs 1490 µs;
  under torch.compile's "eager" backend 826 µs; as AOTAutograd's aten graph 1042 µs. Replacing the
  chain's five ops by one call saves less than any of these add.
- Whole forward, paired against eager (18.47 ms): RMSNorm alone 1.083x [1.080, 1.091]; RMSNorm and
  the chain intercepted 0.693x [0.670, 0.736]; compiled (graph.py) 0.950x [0.911, 0.975]; the chain
  was served in both (288 calls each). The "host µs" column is not host time for this model: its
  forward copies a CPU scalar to the GPU at the start, which waits for the device.
- The per-call row "compiled scope, chain served" (650 µs host) is below the aten graph's own cost;
  whether its chain was served there was not recorded, so that row is not evidence.

``--sweep-only --variants`` answered (H200, 2026-12-02 00:30, after the register loops carry their
values, cd1c861; docs/runs/data/2026-12-02-s5/call2-chain-scope.log): every register configuration
with vec 8 ran 102-105 µs (4.7-4.9x eager's 498 µs; was 145-165 µs), 256 threads a row 146, shared
memory 174. The first configuration with its division by the row's sum as a product with the
reciprocal ran 83.1 µs, with the fast exponential 97.4 µs: the division alone costs a fifth of
the kernel. Both change eager's rounding, so neither is a move of the family; the kernel stays at
about half its memory floor's speed.

With compiled scopes at the torch level (0f2492b; H200, 2026-12-02 01:15, call 5, a host at 10.5 µs
an eager op, ``--configs 1 --repeats 12``): one attention call with the chain served cost 545.5 µs of
host time as Dynamo's graph with the chain's calls replaced, 935.0 µs as the aten graph (eager 575.1,
the "eager" backend 461.1). Whole forward against eager (18.22 ms): RMSNorm alone 1.081x [1.061,
1.086]; with the chain, torch-level scopes 1.118x [1.028, 1.245], aten-graph scopes 1.004x [0.915,
1.138], intercepted 0.699x. The level the scope runs at decides whether the chain pays op by op.

``--noise`` answered (H200, 2026-12-01 23:35, call 6; a host at 13.0 µs an eager op): eager + forge
with the chain in compiled scopes (25 kernel calls a forward: 17 RMSNorm, 8 chains) spread from 16.3
to 22.9 ms forward by forward *before* any torch.compile existed in the process, against eager's
18.0-19.4; after inductor built its copy, 19.8-21.8 ms; with gc.freeze, 19.8-21.0. No garbage
collection ran in any timed forward. So the spread call 3's four-way bench saw is the host-bound
forward's own jitter on such a host, not torch.compile's leftovers or the collector.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS = [
    {"tpr": 64, "rpb": 4, "vec": 8, "cache": "regs", "grid": "rows"},  # the family's first choice
    {"tpr": 32, "rpb": 8, "vec": 8, "cache": "regs", "grid": "rows"},
    {"tpr": 32, "rpb": 4, "vec": 8, "cache": "regs", "grid": "rows"},
    {"tpr": 128, "rpb": 2, "vec": 8, "cache": "regs", "grid": "rows"},
    {"tpr": 128, "rpb": 1, "vec": 8, "cache": "regs", "grid": "rows"},
    {"tpr": 256, "rpb": 1, "vec": 4, "cache": "regs", "grid": "rows"},
    {"tpr": 32, "rpb": 8, "vec": 8, "cache": "regs", "grid": "waves"},
    {"tpr": 64, "rpb": 4, "vec": 8, "cache": "smem", "grid": "rows"},
    {"tpr": 16, "rpb": 16, "vec": 8, "cache": "regs", "grid": "rows"},
    {"tpr": 32, "rpb": 2, "vec": 8, "cache": "regs", "grid": "rows"},
]

import re  # noqa: E402

VARIANTS = {
    # the output loop's division by the row's sum, as a product with its reciprocal (hoisted)
    "recip": lambda src: re.sub(r"\(t(\d+) / t(\d+)\)", r"(t\1 * (1.f / t\2))", src),
    # the fast, approximate exponential
    "fast-exp": lambda src: src.replace(" expf(", " __expf("),
}
"""``--variants``: source edits of the family's first configuration, to tell what bounds it."""


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_us(fn, n: int = 100) -> float:
    for _ in range(3):
        fn()
    _sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    t1 = time.perf_counter_ns()
    _sync()
    return (t1 - t0) / n / 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", type=int, default=len(CONFIGS))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--variants", action="store_true", help="also evaluate VARIANTS of the first configuration")
    ap.add_argument("--sweep-only", action="store_true", help="stop after the configurations (1. alone)")
    ap.add_argument("--noise", action="store_true", help="instead of 2. and 3.: time eager + forge forward by "
                    "forward before and after torch.compile builds a copy of the model in the process")
    args = ap.parse_args()
    dev = args.device

    import torch

    from forge_tui.codegen import Generated
    from forge_tui.config import parse_config
    from forge_tui.evaluator import Evaluator
    from forge_tui.promotion import promote_kernel
    from forge_tui.runtime.apply import _interceptor_class, _outside_scope, apply, called_children
    from forge_tui.runtime.graph import GraphScope
    from forge_tui.templates.registry import match as family_match
    from forge_tui.timing import Timer, paired_ratio
    from forge_tui.workload import load_workload
    from forge_tui.workspace import profile_into_workspace

    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                 "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    tmp = Path(tempfile.mkdtemp(prefix="chain-scope-"))
    cfg_path = tmp / "forge.toml"
    cfg_path.write_text("[timing]\nwarmup = 3\nrepeats = 10\n[profile]\nsamples_per_card = 1\nmax_sample_mib = 1024.0\n")
    spec = str(ROOT / "forge_tui" / "examples" / ("decoder.py" if dev == "cuda" else "tiny_decoder.py"))
    t0 = time.time()
    ws, _ = profile_into_workspace(spec, tmp / "ws", device=dev, config_path=cfg_path)
    out["profile_s"] = round(time.time() - t0, 1)
    cards = ws.cards()
    chain = next(c for c in cards if c.kind == "chain" and "_softmax" in c.target and c.module_paths[0].endswith("self_attn"))
    rms = next(c for c in cards if c.kind == "module" and c.target == "module:RMSNorm")
    print(f"profiled in {out['profile_s']} s: {chain.id} ({chain.share:.1%}, {chain.time_us:.1f} µs), "
          f"{rms.id} ({rms.share:.1%})", flush=True)

    cfg = parse_config({"timing": {"warmup": 3, "repeats": 10, **({} if dev == "cuda" else {"max_spread": 10.0, "max_slowdown": 1000.0})},
                        "evaluator": {"random_sets": 3}})
    gen = Generated()
    m = gen.match(chain)
    rows = []
    best = None
    with Evaluator(ws.store, ws.cache, cfg, backend=dev) as ev:
        for p in (CONFIGS[: args.configs] if dev == "cuda" else [gen.initial(m, "cpu")]):
            if not gen.valid(m, p, dev):
                rows.append({"config": p, "status": "invalid"})
                continue
            src = gen.render(m, p, dev)
            r = ev.evaluate(chain, src)
            row = {"config": p, "status": r.status, "time_us": r.time_us, "vs_eager": r.speedup_vs_eager,
                   "vs_compile": r.speedup_vs_compile, "reason": r.reason[:200]}
            rows.append(row)
            print(f"  chain {p}: {r.status} {r.time_us} µs, {r.speedup_vs_eager}x eager, "
                  f"{r.speedup_vs_compile}x compile {r.reason[:120]}", flush=True)
            if r.correct and r.speedup_vs_eager and (best is None or r.speedup_vs_eager > best[1].speedup_vs_eager):
                best = (src, r)
        for name, edit in (VARIANTS.items() if args.variants and dev == "cuda" else []):
            src = edit(gen.render(m, CONFIGS[0], dev))
            r = ev.evaluate(chain, src)
            rows.append({"config": {**CONFIGS[0], "variant": name}, "status": r.status, "time_us": r.time_us,
                         "vs_eager": r.speedup_vs_eager, "vs_compile": r.speedup_vs_compile, "reason": r.reason[:200]})
            print(f"  chain {name}: {r.status} {r.time_us} µs, {r.speedup_vs_eager}x eager, "
                  f"{r.speedup_vs_compile}x compile {r.reason[:120]}", flush=True)
        fam, mr = family_match(rms)
        rms_src = fam.render(mr, fam.initial(mr, dev), dev)
        r_rms = ev.evaluate(rms, rms_src)
        print(f"  RMSNorm: {r_rms.status} {r_rms.time_us} µs {r_rms.speedup_vs_eager}x", flush=True)
    out["chain_configs"] = rows
    if best is None or not r_rms.correct:
        print("no correct kernel: stopping")
        _write(out)
        return 1
    if args.sweep_only:
        _write(out)
        return 0
    promote_kernel(ws, chain.id, best[0], best[1], by="chain_scope lab")
    promote_kernel(ws, rms.id, rms_src, r_rms, by="chain_scope lab")

    if args.noise:
        noise(ws, spec, dev, out)
        _write(out)
        return 0

    # ---- 2. the whole forward --------------------------------------------------------------------
    wl = load_workload(spec)
    base, inputs = wl.build(dev)
    base.eval()
    import copy

    variants = {"eager": base}
    handles = []
    for name, kw in (("rmsnorm", {"cards": [rms.id]}), ("intercepted", {"compiled_scopes": False}),
                     ("compiled", {"compiled_scopes": True}), ("compiled-aten", {"compiled_scopes": True})):
        mdl = copy.deepcopy(base)
        handles.append(apply(mdl, ws, only_faster=False, trial_calls=0, **kw))
        if name == "compiled-aten":  # the scopes run AOTAutograd's aten graph, as before 2026-12-02
            for sc in handles[-1].scopes.values():
                sc.torch_level = False
        variants[name] = mdl
    timer = Timer(dev, warmup=3, repeats=args.repeats, cold_l2=False)
    with torch.no_grad():
        stats, raw, _ = timer.time({k: (lambda mm=mm: wl.run(mm, inputs)) for k, mm in variants.items()})
        hosts = {k: host_us(lambda mm=mm: wl.run(mm, inputs), 10) for k, mm in variants.items()}
    fwd = {}
    for k in variants:
        r = paired_ratio(raw["eager"], raw[k])
        fwd[k] = {"median_us": stats[k].median, "vs_eager": r.median, "q1": r.q1, "q3": r.q3, "host_us": hosts[k]}
    for h in handles:
        for c in h.status()["cards"]:
            fwd.setdefault("served", {})[c["card"] + " " + ",".join(c["sites"])] = c["served"]
    fwd["levels"] = {name: sorted({lv for sc in h.scopes.values() for lv in sc.levels})
                     for name, h in zip(("rmsnorm", "intercepted", "compiled", "compiled-aten"), handles)}
    out["forward"] = fwd
    print("\nforward        median µs   vs eager [q1, q3]        host µs (not waiting for the device)")
    print(f"scopes ran at: {fwd['levels']}")
    for k in variants:
        f = fwd[k]
        print(f"{k:13s} {f['median_us']:10.1f}   {f['vs_eager']:.3f}x [{f['q1']:.3f}, {f['q3']:.3f}]   {f['host_us']:10.1f}")

    # ---- 3. one attention call on the host ------------------------------------------------------
    att = base.layers[0].self_attn
    seen = {}
    h = att.register_forward_pre_hook(lambda mod, a: seen.setdefault("args", a))
    with torch.no_grad():
        wl.run(base, inputs)
    h.remove()
    a = seen["args"]
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    plain = aot_autograd(fw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
                         inference_compiler=lambda gm, ex: make_boxed_func(gm.forward))
    calls = {"eager": att,
             "dynamo eager backend": torch.compile(att.forward, backend="eager", dynamic=False),
             "dynamo aot (no card)": torch.compile(att.forward, backend=plain, dynamic=False)}
    served = handles[2].guards.get(chain.id)
    calls["compiled scope, chain served"] = GraphScope(att, att.forward, [served], dev)
    aten = GraphScope(att, att.forward, [served], dev)
    aten.torch_level = False
    calls["aten graph, chain served"] = aten
    Interceptor = _interceptor_class()
    owner = object()
    orig = att.forward

    def intercepted(*xs):
        with Interceptor({}, owner, None):
            return orig(*xs)

    calls["interceptor, nothing served"] = intercepted
    per = {}
    with torch.no_grad():
        kids = [(c, c.forward) for c in called_children(att)]
        for k, fn in calls.items():
            if k.startswith("interceptor"):
                for c, f in kids:
                    c.forward = _outside_scope(f, owner)
            per[k] = {"host_us": host_us(lambda fn=fn: fn(*a), 50)}
            _sync()
            t0 = time.perf_counter_ns()
            for _ in range(20):
                fn(*a)
            _sync()
            per[k]["wall_us"] = (time.perf_counter_ns() - t0) / 20 / 1000.0
            for c, _ in kids:
                c.__dict__.pop("forward", None)
    out["attention_call"] = per
    print("\none attention call        host µs   wall µs (device waited for)")
    for k, v in per.items():
        print(f"{k:28s} {v['host_us']:8.1f} {v['wall_us']:9.1f}")
    x = torch.randn(16, device=dev)
    out["eager_op_host_us"] = host_us(lambda: x + x, 500)
    print(f"one eager op (x + x, 16 elements): {out['eager_op_host_us']:.1f} µs host")
    _write(out)
    return 0


def noise(ws, spec: str, dev: str, out: dict) -> None:
    """Eager and eager + forge (compiled scopes) timed forward by forward, each synchronised:
    before torch.compile (inductor) has built a copy of the model in this process, after (the
    compiled copy run between them), and after that with the process's objects frozen out of the
    garbage collector; with each sample's collections and the scopes' Dynamo compiles."""
    import copy
    import gc

    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload

    wl = load_workload(spec)
    base, inputs = wl.build(dev)
    base.eval()
    fm = copy.deepcopy(base)
    applied = apply(fm, ws, only_faster=False, trial_calls=0)
    pauses: list[float] = []

    def cb(phase, info, t=[0]):  # noqa: B006 - the start time of the collection under way
        if phase == "start":
            t[0] = time.perf_counter_ns()
        else:
            pauses.append((time.perf_counter_ns() - t[0]) / 1e6)

    def one(m) -> tuple[float, int]:
        _sync()
        n = len(pauses)
        t0 = time.perf_counter_ns()
        wl.run(m, inputs)
        _sync()
        return round((time.perf_counter_ns() - t0) / 1000.0, 1), len(pauses) - n

    def served() -> int:
        return sum(c["served"] for c in applied.status()["cards"])

    gc.callbacks.append(cb)
    phases: dict[str, list] = {}
    with torch.no_grad():
        for _ in range(3):
            wl.run(fm, inputs)
            wl.run(base, inputs)
        phases["before torch.compile"] = [(one(base), one(fm)) for _ in range(12)]
        comp = torch.compile(copy.deepcopy(base))
        t0 = time.time()
        for _ in range(3):
            wl.run(comp, inputs)
        out["inductor_compile_s"] = round(time.time() - t0, 1)
        s0 = served()
        phases["after torch.compile"] = [(one(base), one(fm), one(comp)) for _ in range(12)]
        out["served_per_forward_after"] = (served() - s0) / 12
        gc.collect()
        gc.freeze()
        phases["after, gc.freeze"] = [(one(base), one(fm), one(comp)) for _ in range(12)]
        gc.unfreeze()
    gc.callbacks.remove(cb)
    out["noise"] = phases
    out["scopes"] = {p: sc.sites for p, sc in applied.scopes.items()}
    print("\nper forward µs (collections in it): eager, eager + forge[, torch.compile]")
    for name, rows in phases.items():
        print(name)
        for row in rows:
            print("   " + "   ".join(f"{us:9.1f} ({n})" for us, n in row))
    print(f"inductor compile {out['inductor_compile_s']} s; served per forward after it: "
          f"{out['served_per_forward_after']}; scopes' sites: {out['scopes']}")


def _write(out: dict) -> None:
    dest = Path(os.environ.get("OUT") or ROOT / "bench-out")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "chain_scope.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
