"""What forge's runtime costs the host: its overhead over eager on the whole forward, with nothing
promoted and with every kernel falling back (``measure_overhead``), and each served card's cost a
call against eager's ops for it (``measure_per_call``). The e2e bench reports both."""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any


def host_us_per_call(fn, device: str, n: int) -> float:
    """Host time of one call (µs) over n back-to-back calls, the device not waited for: what a
    call costs the CPU (dispatch, checks, launch), the time the device needs to keep up."""
    import torch

    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    t1 = time.perf_counter_ns()
    if device == "cuda":
        torch.cuda.synchronize()
    return (t1 - t0) / n / 1000.0


def measure_overhead(spec: str, ws: Any, dev: str, repeats: int, tmp: Path, with_kernels: bool) -> dict[str, Any]:
    """The runtime with nothing promoted (an empty manifest: nothing is installed, so the forward
    should be eager's), and with every promoted kernel installed but disabled (each call goes
    through its guard or the op interceptor and falls back): interleaved with eager, paired."""
    import torch

    from ..runtime.apply import apply
    from ..runtime.manifest import Manifest
    from ..timing import Timer, paired_ratio
    from ..workload import load_workload

    empty = tmp / "nothing-promoted"
    Manifest().save(empty / "kernels")
    wl = load_workload(spec)
    model, inputs = wl.build(dev)
    model.eval()
    variants = {"eager": model}
    m0 = copy.deepcopy(model)
    a0 = apply(m0, empty, device=dev)
    variants["nothing promoted"] = m0
    a1 = None
    if with_kernels:
        m1 = copy.deepcopy(model)
        a1 = apply(m1, ws, device=dev, only_faster=False)
        a1.take_outs = False  # the cards' checks on every call, as a card that refuses them pays
        # every card on the board: kernels, folds and experts cards alike, so that no rewrite card
        # goes on serving in this variant
        for st in list(a1.board.cards.values()):
            a1.board.disable(st, "e2e_bench: timing the interception alone")
        if a1.board.cards:
            variants["every kernel falling back"] = m1
    timer = Timer(dev, warmup=3, repeats=repeats, cold_l2=False)
    with torch.no_grad():
        stats, raw, _ = timer.time({k: functools.partial(wl.run, m, inputs) for k, m in variants.items()})
    out: dict[str, Any] = {"installed_nothing": not a0.guards, "times_us": {k: s.to_json() for k, s in stats.items()}}
    for k in variants:
        if k != "eager":
            r = paired_ratio(raw[k], raw["eager"])  # > 1: slower than eager
            out[k] = {"overhead": r.median - 1, "q1": r.q1 - 1, "q3": r.q3 - 1}
    if a1 is not None:
        out["fallbacks"] = {c["card"]: dict(c["fallbacks"]) for c in a1.status()["cards"]}
        a1.undo()
    a0.undo()
    return out


def measure_per_call(spec: str, ws: Any, dev: str, cards: list[str], n: int) -> dict[str, Any]:
    """Per served card: the host cost of one served call (the guard's checks plus the launch,
    ``Guard.serve`` on the card's captured inputs), the guard's own share of it, and eager's host
    cost for the same card (its program, op by op); beside them, eager's cost to launch one op."""
    import torch

    from ..inputs import sample_inputs
    from ..program import run_program
    from ..runtime.apply import apply
    from ..workload import load_workload

    a = torch.randn(16, device=dev)
    b = torch.randn(16, device=dev)
    res: dict[str, Any] = {"eager_op_launch_us": host_us_per_call(lambda: a + b, dev, max(n, 200)), "cards": {}}
    model, _ = load_workload(spec).build(dev)  # the guards are installed in it, never called through it
    applied = apply(model, ws, device=dev, only_faster=False, cards=cards)
    try:
        for cid in cards:
            if cid in applied.experts or cid in applied.merges:
                g = applied.experts.get(cid) or applied.merges[cid]
                res["cards"][cid] = {"note": "an experts card: the block's forward in one grouped pass"
                                     if cid in applied.experts else "a merge card: sibling linears in one product",
                                     "sites": list(g.status.sites)}
                continue
            if cid in applied.folds:
                sites = list(applied.folds[cid].status.sites)
                finished = sum("(with its" in site for site in sites)
                res["cards"][cid] = {"note": "a fold card: the convolution's own call" + (
                    f", then forge's epilogue at {finished} of its {len(sites)} sites" if finished else ""),
                    "sites": sites}
                continue
            guard = applied.guards.get(cid)
            card = ws.card(cid)
            if guard is None or not card.samples:
                res["cards"][cid] = {"note": "no guard" if guard is None else "no captured sample"}
                continue
            ins = sample_inputs(card, ws.store, 0, dev)
            why = guard.mismatch(ins)
            if why:
                res["cards"][cid] = {"note": f"its captured inputs do not pass its guard: {why}"}
                continue
            served = host_us_per_call(lambda g=guard, x=ins: g.serve(x), dev, n)
            eager = host_us_per_call(lambda p=card.program, x=ins: run_program(p, x, dev), dev, n)
            res["cards"][cid] = {"served_us": served, "guard_us": guard.status.dispatch_us, "eager_card_us": eager,
                                 "eager_ops": len(card.program.get("nodes", [])), "active": guard.status.active,
                                 "sites": list(guard.status.sites)}
            if len(guard.sig.outputs) > 1:
                # what a leaf module serving the op pays: it returns the first output (a group or
                # layer norm's), and the others (mean, rstd) are not allocated per call
                res["cards"][cid]["served_first_us"] = host_us_per_call(
                    lambda g=guard, x=ins: g.serve(x, keep=0), dev, n)
            leaf = next((p for p in card.module_paths or [] if p in applied.leaves), None)
            if leaf is not None:
                res["cards"][cid].update(leaf_call_us(model.get_submodule(leaf), applied.leaves[leaf], ins[0], dev, n))
    finally:
        applied.undo()
    return res


def leaf_call_us(mod: Any, leaf: Any, x: Any, dev: str, n: int) -> dict[str, Any]:
    """A leaf module that serves the card (nn.GroupNorm, nn.LayerNorm) called as the model calls
    it, with the card's captured input: its host µs a call once its site is learned and its guard
    settled (the fast path, ``_LeafSites._fast``), and eager's own call of the module."""
    import torch

    with torch.no_grad():
        for _ in range(60):  # learned, the dispatch timed, the fast path built
            mod(x)
        served = host_us_per_call(lambda: mod(x), dev, n)
        fast = leaf.fast is not None
        replaced = mod.__dict__.pop("forward")
        try:
            eager = host_us_per_call(lambda: mod(x), dev, n)
        finally:
            mod.forward = replaced
    return {"leaf_served_us": served, "leaf_eager_us": eager, "leaf_fast": fast}

