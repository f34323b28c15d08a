"""``bench``: the whole forward timed four ways in one process (see the package's docstring), the
outputs judged, the switch-offs run and the bounds computed."""

from __future__ import annotations

import copy
from typing import Any

from ..errors import ForgeError
from ..promotion import kernels_dir
from ..runtime.apply import Mode, apply
from ..runtime.manifest import Manifest
from ..timing import Stats, Timer, paired_ratio
from . import graphs
from .accuracy import judge_outputs, run_fp32
from .bounds import bound_basis, card_own_us, compile_bound, isolation_bound, own_bound, own_saved_us, promised_us, shares_note
from .memory import GcPauses, release
from .options import BenchOptions
from .own_process import FRESH_MIN_S, FRESH_TIMEOUT_S, fresh_compile_pair
from .result import AFTER_SWITCH_OFF, FRESH_COMPILE, BenchResult
from .scopes import scope_notes
from .switch_off import switch_off_slower
from .switch_off_compile import switch_off_under_compile
from .switch_off_graphs import switch_off_in_graphs


def bench(workload_spec: Any, workspace: Any, options: BenchOptions | None = None) -> BenchResult:
    """The whole forward timed four ways (see the package's docstring). ``options.graphs`` (cuda): also
    eager and eager + forge captured in CUDA graphs (``graphs.GRAPH_VARIANTS``), which take the host's
    launch cost out of both: the ratio between them (paired, timed apart from the four ways, after
    them) is what the kernels save on the device. The graphed model gets the kernels as
    ``Mode.CUDA_GRAPH`` gives them, and with ``options.switch_off`` their verdict in graphs is decided on
    graphed forwards (``switch_off_in_graphs``), apart from the op-by-op one.
    ``options.switch_off_compile``: the torch.compile verdict alone on or off (default: as
    ``options.switch_off``).
    ``options.own_process_check``: a verdict to keep the kernels in compiled models is confirmed in a
    process of its own (``fresh_compile_pair``), whose ratio is ``FRESH_COMPILE``; it must end by
    ``options.own_process_deadline`` (``time.time()``) where one is given."""
    import torch

    from ..workload import load_workload, resolve_device
    from ..workspace import Workspace

    opts = options if options is not None else BenchOptions()
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    dev = resolve_device(opts.device)
    wl = load_workload(workload_spec)
    model, inputs = wl.build(dev, opts.dtype)
    model.eval()
    folder = kernels_dir(ws)
    man = Manifest.load(folder)
    if not man.entries:
        raise ForgeError(f"{ws.root} has no promoted kernels (forge approve promotes them)")
    notes: list[str] = []
    variants: dict[str, Any] = {"eager": model}
    forge_model = copy.deepcopy(model)
    # no in-place trial: the bench times the whole forward both ways itself, interleaved
    applied = apply(forge_model, ws, mode=Mode.INFERENCE, device=dev, only_faster=opts.only_faster, trial_calls=0)
    notes.extend(f"not used {c}: {why}" for c, why in applied.skipped.items())
    variants["eager+forge"] = forge_model
    graph_models: tuple[Any, Any] | None = None
    graph_applied = None
    if opts.graphs and dev not in graphs.GRAPH_DEVICES:
        notes.append("CUDA graphs: not on this device")
    elif opts.graphs:
        # the kernels as a captured model gets them: by their verdict in graphs, not op by op
        gm = copy.deepcopy(model)
        graph_applied = apply(gm, ws, mode=Mode.CUDA_GRAPH, device=dev, only_faster=opts.only_faster)
        notes.extend(f"not used in CUDA graphs {c}: {why}" for c, why in graph_applied.skipped.items()
                     if "in CUDA graphs" in why)
        graph_models = (model, gm)
    compiled_applied = None
    if opts.with_compile:
        variants["compile"] = torch.compile(copy.deepcopy(model), backend=opts.compile_backend)
        cf = copy.deepcopy(model)
        compiled_applied = apply(cf, ws, mode=Mode.TORCH_COMPILE, device=dev, only_faster=opts.only_faster)
        # module cards are custom ops in any compiled model; the apply's backend serves its op and
        # chain cards in the compiled graphs, then hands them to ``compile_backend``
        variants["compile+forge"] = torch.compile(cf, backend=compiled_applied.backend(opts.compile_backend))
    timer = Timer(dev, warmup=opts.warmup, repeats=opts.repeats, cold_l2=False)
    graph_ratio: Stats | None = None
    with torch.no_grad():
        ref = wl.run(model, inputs)
        outs = {name: wl.run(m, inputs) for name, m in variants.items() if name != "eager"}
        pauses = GcPauses()
        fns = {name: (lambda m=m, n=name: pauses.run(n, wl.run, m, inputs)) for name, m in variants.items()}
        agree, accuracy = judge_outputs(outs, ref, lambda: run_fp32(wl, model, inputs))
        del outs
        with pauses:
            stats, raw, _ = timer.time(fns)
        notes.extend(pauses.notes())
        notes.extend(scope_notes(applied))
        # the compiled variants are done with (their verdict reads the timings, not the models):
        # their memory (inductor's buffers, the outputs they keep) goes back before the switch-off
        # times fresh copies and the graphs are captured: kept, it can leave the graphs' capture
        # out of memory and slow the switch-off's copies of the forward
        release(variants, fns, ("compile", "compile+forge"))
        switched: dict[str, str] = {}
        after: Stats | None = None
        units: list[dict[str, Any]] = []
        if opts.switch_off:
            switched, after = switch_off_slower(wl, model, inputs, ws, man, applied, dev, timer, opts.only_faster,
                                                stats, raw, units)
            promised = promised_us(ws, man, stats["eager"].median)
            for u in units:
                each = [promised.get(c) for c in u["cards"]]
                u["promised_us"] = None if any(v is None for v in each) else sum(v for v in each if v is not None)
        fresh: Stats | None = None
        if opts.compile_verdict() and compiled_applied is not None:
            def confirm() -> tuple[dict[str, list[float]], dict[str, int]] | str:
                limit = FRESH_TIMEOUT_S
                if opts.own_process_deadline is not None:
                    import time

                    limit = min(limit, opts.own_process_deadline - time.time())
                    if limit < FRESH_MIN_S:
                        return f"{max(limit, 0.0):.0f} s were left for it before the run's deadline"
                return fresh_compile_pair(workload_spec, ws, dev, opts, timeout_s=limit)

            off, fresh = switch_off_under_compile(ws, man, compiled_applied, stats, raw, dev,
                                                  confirm=confirm if opts.own_process_check else None)
            switched.update(off)
        if graph_models is not None and graph_applied is not None:  # last: a failed capture cannot disturb the above
            g_stats, g_raw, g_agree, g_acc, g_fns, g_pieces = graphs.graph_variants(wl, inputs, graph_models, timer,
                                                                                     ref, notes, model)
            stats.update(g_stats)
            agree.update(g_agree)
            accuracy.update(g_acc)
            if g_raw:
                graph_ratio = paired_ratio(g_raw[graphs.GRAPH_VARIANTS[0]], g_raw[graphs.GRAPH_VARIANTS[1]])
                if opts.switch_off:
                    switched.update(switch_off_in_graphs(wl, model, inputs, ws, man, graph_applied, dev, timer,
                                                         opts.only_faster, g_stats, g_raw, g_fns, notes,
                                                         bool(g_pieces)))
            del g_fns
            for h in g_pieces:
                h.undo()
    speedups = {n: paired_ratio(raw["eager"], raw[n]) for n in raw if n != "eager"}
    if "compile+forge" in raw:
        speedups["compile+forge/compile"] = paired_ratio(raw["compile"], raw["compile+forge"])
    if fresh is not None:
        speedups[FRESH_COMPILE] = fresh
    if graph_ratio is not None:
        speedups["graphs: forge/eager"] = graph_ratio
    if after is not None:
        speedups[AFTER_SWITCH_OFF] = after
    served = {c["card"]: c["served"] for c in applied.status()["cards"]}
    served_compiled = ({c["card"]: c["served"] for c in compiled_applied.status()["cards"]}
                       if compiled_applied is not None else {})
    # the served cards' own times, the forward's counts read first (these calls are not its)
    with torch.no_grad():
        own = card_own_us(ws, applied, [c for c, n in served.items() if n], dev)
    eager_us = stats["eager"].median
    saved_own = own_saved_us(ws, man, {c: 1 for c in man.entries}, eager_us, own)
    for u in units:
        each = [saved_own.get(c) for c in u["cards"]]
        u["promised_own_us"] = None if any(v is None for v in each) else sum(v for v in each if v is not None)
    applied.undo()
    if compiled_applied is not None:
        compiled_applied.undo()
    if graph_applied is not None:
        graph_applied.undo()
    c_bound = compile_bound(ws, man, served_compiled, stats["compile"].median) if "compile" in stats else None
    if (past := shares_note(ws)) is not None:
        notes.append(past)
    return BenchResult(dev, stats, speedups, agree, isolation_bound(ws, man, served), served, switched, notes,
                       accuracy, served_compiled, c_bound, units, own, own_bound(ws, man, served, eager_us, own),
                       bound_basis(stats))
