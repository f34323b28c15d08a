"""``forge bench WORKLOAD -w WS``: the whole forward four ways (eager, eager + forge, torch.compile,
torch.compile + forge), timed interleaved in one process with spread, outputs checked against
eager (torch.compile + forge against torch.compile), and where they miss the tolerance, for
accuracy against the model run in fp32. A kernel that makes the whole forward slower is switched off in the manifest: kernels are
used only where they measured faster in the model, not only in isolation. When torch.compile +
forge runs slower than torch.compile, the kernels it served are switched off for compiled models.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .cards import CardKind
from .compare import compare
from .errors import ForgeError
from .program import tensor_leaves
from .promotion import commit_manifest, kernels, kernels_dir
from .rewrites import REWRITES
from .runtime.apply import Mode, apply
from .runtime.fold import Pair
from .runtime.manifest import Manifest
from .runtime.pieces import end_failed_capture as _end_failed_capture
from .timing import Stats, Timer, paired_ratio

AFTER_SWITCH_OFF = "eager+forge after the switch-off"
"""The speedup key of eager / eager + forge re-measured with the kernels a switch-off left on."""


@dataclass
class BenchResult:
    device: str
    times: dict[str, Stats]
    speedups: dict[str, Stats]
    """Paired ratios against eager (and "compile+forge" against "compile")."""
    outputs_agree: dict[str, str | None]
    """None where the variant's outputs match eager's within tolerance, else what differs."""
    bound: float | None
    """1 / (1 - sum of share x (1 - 1/speedup)) over the served cards: what isolation promises."""
    served: dict[str, int]
    switched_off: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Variants whose outputs missed the element tolerance, judged instead against the model run in
    fp32: their relative error and that of the output they were checked against ("error",
    "baseline_error", "baseline", "outside": what missed the tolerance)."""
    served_compiled: dict[str, int] = field(default_factory=dict)
    """Calls served per card in the torch.compile + forge forwards (custom ops and the cards served
    in the compiled graphs): these cards decide where torch.compile + forge must beat
    torch.compile, not those eager + forge serves (ResNet-50's batch norms are served only there:
    op by op they are folded into the convolutions)."""
    compile_bound: float | None = None
    """What the cards served under torch.compile promise over torch.compile's forward, from their
    isolated speedups over torch.compile's own kernels (``compile_bound``)."""
    units: list[dict[str, Any]] = field(default_factory=list)
    """Per switch-off unit, what it saves in the model against what isolation promises: "cards",
    "with_us" and "without_us" (the forward with every served kernel and without the unit's,
    medians of one interleaved measurement), "promised_us" (the unit's share of eager's forward
    times 1 - 1/speedup, summed over its cards; None where a card lacks either), and
    "promised_own_us" (what the cards' own times promise, ``own_saved_us``)."""
    own_times: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per card its kernel served, eager's ops for the card and the served call, µs a call each,
    timed in this process on the card's captured inputs (``card_own_us``: on cuda the device's
    time alone, the host out)."""
    own_bound: float | None = None
    """The bound from those times (``own_bound``): what the cards save where the forward waits on
    its device, not on its host."""
    bound_basis: str = "isolation"
    """Which bound the forward's speedup is held to: "own times" where the forward is bound by its
    device (``bound_basis``), else "isolation" (``bound``)."""

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "times_us": {k: v.to_json() for k, v in self.times.items()},
                "speedups": {k: v.to_json() for k, v in self.speedups.items()}, "outputs_agree": self.outputs_agree,
                "bound": self.bound, "served": self.served, "switched_off": self.switched_off, "notes": self.notes,
                "accuracy": self.accuracy, "served_compiled": self.served_compiled,
                "compile_bound": self.compile_bound, "units": self.units,
                "own_times_us": {c: list(v) for c, v in self.own_times.items()}, "own_bound": self.own_bound,
                "bound_basis": self.bound_basis}

    def all_switched_off(self) -> bool:
        """Whether the op-by-op verdict switched off every kernel the eager + forge forward served."""
        served = [c for c, n in self.served.items() if n]
        return bool(served) and all(c in self.switched_off for c in served)

    def forge_mismatches(self) -> dict[str, str]:
        """The forge variants whose outputs do not agree (torch.compile's own differences from
        eager are reported in the table but are not forge's)."""
        return {k: v for k, v in self.outputs_agree.items() if v and "forge" in k}

    def table(self) -> str:
        lines = [f"{'variant':18s} {'median µs':>11s} {'q1 - q3':>19s} {'vs eager':>9s}  outputs"]
        for name, st in self.times.items():
            sp = self.speedups.get(name)
            agree = self.outputs_agree.get(name)
            acc = self.accuracy.get(name)
            said = "agree" if agree is None else agree
            if agree is None and acc:
                said = (f"as accurate as {acc['baseline']} against the model in fp32 (relative error "
                        f"{acc['error']:.3g} vs {acc['baseline_error']:.3g}); outside the element tolerance: "
                        f"{acc['outside']}")
            lines.append(f"{name:18s} {st.median:11.1f} {st.q1:9.1f} - {st.q3:7.1f} "
                         f"{(f'{sp.median:.3f}x' if sp else '-'):>9s}  {said}")
        if "compile+forge/compile" in self.speedups:
            bound = (f" (bound from the cards served there, their isolated speedups over torch.compile's kernels "
                     f"and their time: {self.compile_bound:.3f}x)" if self.compile_bound else "")
            lines.append(f"torch.compile + forge vs torch.compile: {self.speedups['compile+forge/compile'].median:.3f}x"
                         + bound)
        if (own := self.speedups.get(FRESH_COMPILE)) is not None:
            lines.append(f"torch.compile + forge vs torch.compile in a process of their own: {own.median:.3f}x "
                         f"[{own.q1:.3f}, {own.q3:.3f}] (the verdict's)")
        g = self.speedups.get("graphs: forge/eager")
        if g:
            lines.append(f"in CUDA graphs, eager + forge vs eager: {g.median:.3f}x [{g.q1:.3f}, {g.q3:.3f}]")
        sp = self.speedups.get("eager+forge")

        def reached(bound: float) -> str:
            return f"{sp.median:.3f}x, {100 * (sp.median - 1) / (bound - 1):.0f}% of the way" if sp and bound > 1 else "-"

        if self.bound:
            lines.append(f"bound from the served cards' isolated speedups and shares: {self.bound:.3f}x "
                         f"(reached {reached(self.bound)})")
        if self.own_bound:
            clock = "device time, the host out" if self.device == "cuda" else "their time"
            lines.append(f"bound from the served cards' own times in this process (eager's ops against the served "
                         f"call, {clock}): {self.own_bound:.3f}x (reached {reached(self.own_bound)})")
        for card, (e, o) in self.own_times.items():
            lines.append(f"  {card}: eager's ops {e:.1f} µs a call, served {o:.1f}")
        if self.bound or self.own_bound:
            lines.append("the forward is held to the bound from " + (
                "the cards' own times: bound by its device, it waits on their device time alone"
                if self.bound_basis == "own times" else "isolation" + (
                    "" if "eager (graph)" in self.times or self.device != "cuda" else
                    " (without CUDA graphs, --graphs, the bench cannot tell whether the forward is bound by its device)")))
        for u in self.units:
            promised = f"; isolation promised {u['promised_us']:.0f}" if u.get("promised_us") is not None else ""
            if u.get("promised_own_us") is not None:
                promised += f", the cards' own times {u['promised_own_us']:.0f}"
            lines.append(f"in the model {' + '.join(u['cards'])} saved {u['without_us'] - u['with_us']:.0f} µs a forward "
                         f"({u['with_us']:.0f} with it, {u['without_us']:.0f} without){promised}")
        for card, why in self.switched_off.items():
            lines.append(f"switched off {card}: {why}")
        after = self.speedups.get(AFTER_SWITCH_OFF)
        if after:
            lines.append(f"eager + forge with the kernels left on: {after.median:.3f}x [{after.q1:.3f}, {after.q3:.3f}]")
        elif self.all_switched_off():
            lines.append("eager + forge serves none of its kernels now: the model runs eager's own code")
        lines.extend(self.notes)
        return "\n".join(lines)


CHUNK = 1 << 24
"""Elements of an output compared at a time: a decoder's logits (4 x 1024 x 262144) in float64,
with the comparison's masks, would take tens of GB at once."""


def _slices(x: Any, y: Any) -> Any:
    """Flat slices of ``CHUNK`` elements of two tensors of one shape, in step."""
    xf, yf = x.reshape(-1), y.reshape(-1)
    for start in range(0, max(yf.numel(), 1), CHUNK):
        yield start, xf[start:start + CHUNK], yf[start:start + CHUNK]


def _rms(y: Any) -> float:
    """The root mean square of a floating tensor, a slice at a time."""
    total = sum(float(ys.double().pow(2).sum()) for _, _, ys in _slices(y, y))
    return (total / max(y.numel(), 1)) ** 0.5


def _agree(got: Any, ref: Any, ref_name: str = "eager") -> str | None:
    a, b = tensor_leaves(got), tensor_leaves(ref)
    if len(a) != len(b):
        return f"{len(a)} outputs where {ref_name} has {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        # whole-model tolerance: a fused kernel rounds once where eager rounds at every op
        dt = str(y.dtype).removeprefix("torch.")
        loose = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2), "bfloat16": (4e-2, 4e-2)}.get(dt)
        rtol, atol = loose if loose else (None, None)
        scale = _rms(y) if y.is_floating_point() else None
        if x.shape != y.shape or x.dtype != y.dtype or y.numel() <= CHUNK:
            m = compare(x, y, i, rtol=rtol, atol=atol, scale=scale)
            if m is not None:
                return str(m)
            continue
        for start, xs, ys in _slices(x, y):
            m = compare(xs, ys, i, rtol=rtol, atol=atol, scale=scale)
            if m is not None:
                return f"{m} (of its elements {start} to {start + ys.numel() - 1}, in a flat order)"
    return None


CHECKED_AGAINST = {"compile+forge": "compile", "eager+forge (graph)": "eager (graph)"}
"""What each variant's outputs are checked against (eager where not named): torch.compile's own
rounding is not forge's to answer for, so torch.compile + forge is held to torch.compile."""

ACCURACY_SLACK = 1.1
"""A variant outside the element tolerance still agrees when its error against the model run in
fp32 is at most this many times that of the output it is checked against, or of eager's where
that is larger: never less accurate than eager (routing by top-k or a
threshold turns a last-bit difference into a different path for a few tokens: eager's own bf16
run differs from fp32 the same way)."""


def _floats(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_floats(v) for v in x)
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    return x


def _run_fp32(wl: Any, model: Any, inputs: Any) -> Any:
    """The model's outputs with its weights and floating inputs in fp32 (a copy: ``model`` is left
    as it is); None when the model will not run so."""
    try:
        m32 = copy.deepcopy(model).float()
        return wl.run(m32, _floats(inputs))
    except Exception:  # noqa: BLE001 - a model written for one dtype: no fp32 judgement, the mismatch stands
        return None


def relative_error(got: Any, ref: Any) -> float | None:
    """||got - ref|| / ||ref|| over every floating output (inf where their non-finite values
    disagree); None where there is no floating output."""
    import torch

    num = den = 0.0
    floats = False
    for x, y in zip(tensor_leaves(got), tensor_leaves(ref)):
        if not y.is_floating_point():
            continue
        floats = True
        for _, xs, ys in _slices(x, y):
            xs, ys = xs.double(), ys.double()
            fx, fy = torch.isfinite(xs), torch.isfinite(ys)
            if not torch.equal(fx, fy):
                return float("inf")
            num += float((xs[fx] - ys[fy]).pow(2).sum())
            den += float(ys[fy].pow(2).sum())
    if not floats:
        return None
    return (num / den) ** 0.5 if den > 0 else (0.0 if num == 0 else float("inf"))


def _exact_where_not_float(got: Any, ref: Any) -> bool:
    """Every integer and bool output equal to the reference's (a routing flip excuses rounding
    in floating outputs, never a different index or mask)."""
    import torch

    return all(torch.equal(x, y) for x, y in zip(tensor_leaves(got), tensor_leaves(ref)) if not y.is_floating_point())


def _judge_outputs(outs: dict[str, Any], ref: Any, fp32: Any) -> tuple[dict[str, str | None], dict[str, dict[str, Any]]]:
    """Each variant against eager's outputs (or what CHECKED_AGAINST names) within the whole-model
    tolerance; one outside it is judged again against the model in fp32 (``fp32()``, run once and
    only if needed) and agrees if it is as accurate as what it was checked against."""
    agree: dict[str, str | None] = {}
    accuracy: dict[str, dict[str, Any]] = {}
    ref32: list[Any] = []
    for name, out in outs.items():
        base_name = CHECKED_AGAINST.get(name, "eager")
        base = outs[base_name] if base_name in outs else ref
        base_name = base_name if base_name in outs else "eager"
        m = _agree(out, base, base_name)
        agree[name] = m
        if m is None:
            continue
        if not ref32:
            ref32.append(fp32())
        if ref32[0] is None or len(tensor_leaves(ref32[0])) != len(tensor_leaves(out)) \
                or not _exact_where_not_float(out, base):
            continue
        err, base_err = relative_error(out, ref32[0]), relative_error(base, ref32[0])
        if err is None or base_err is None:
            continue
        if base_name != "eager":  # held to the less accurate of its baseline and eager: never worse than eager
            eager_err = relative_error(ref, ref32[0])
            if eager_err is not None and math.isfinite(eager_err) and eager_err > base_err:
                base_err, base_name = eager_err, "eager"
        accuracy[name] = {"error": err, "baseline_error": base_err, "baseline": base_name, "outside": m}
        # a baseline whose own error is not finite (an overflow in eager) vouches for nothing
        if math.isfinite(base_err) and err <= ACCURACY_SLACK * base_err:
            agree[name] = None
        else:
            agree[name] = (f"{m}; against the model in fp32 its relative error is {err:.3g}, {base_name}'s "
                           f"{base_err:.3g}")
    return agree, accuracy


GRAPH_VARIANTS = ("eager (graph)", "eager+forge (graph)")
"""With ``graphs``: eager and eager + forge, each forward captured once in a CUDA graph and replayed."""
GRAPH_DEVICES = ("cuda",)


def cuda_graphed(run: Any, warmup: int = 3) -> tuple[Any, Any]:
    """(replay, the graph's output): ``run``'s forward captured in a CUDA graph (after ``warmup``
    calls on a side stream, as torch.cuda.graphs asks), replayed on the same input tensors. The
    host's work (Python, dispatch, forge's guards) happens once, at capture: a replay launches the
    recorded kernels alone, so what is left is the device's time. Raises ForgeError when the
    forward cannot be captured (it synchronises with the host, for one), with the forward's own
    error where ending the capture raised over it; the caller's stream is current again."""
    import torch

    caller = torch.cuda.current_stream()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                run()
        caller.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported as the reason the variant is missing
        cause = exc.__context__ if exc.__context__ is not None else exc  # what failed inside the capture
        text = str(cause).splitlines()[0][:300] if str(cause) else ""
        torch.cuda.set_stream(caller)
        _end_failed_capture()
        raise ForgeError(f"{type(cause).__name__}: {text}") from exc
    finally:
        torch.cuda.set_stream(caller)  # a capture that failed to end leaves its stream current
    return graph.replay, out


def _piece_capturer() -> Any:
    """The capture the pieces use (CUDA graphs; the tests put a stand-in here)."""
    from .runtime.pieces import CudaCapturer

    return CudaCapturer()


def piecewise_graphed(run: Any, model: Any, warmup: int = 3) -> tuple[Any, Any, Any]:
    """(run, its output, the Pieces handle): ``model``'s forward replayed from CUDA graphs piece
    by piece (``runtime.pieces``), for a forward that cannot be captured whole; its first calls
    capture the pieces. ``run`` calls the model, so its host work outside the pieces stays. Raises
    ForgeError when no piece could be captured; the caller undoes the handle."""
    import torch

    from .runtime.pieces import capture_pieces

    dev = next((p.device.type for p in model.parameters()), "cuda")
    pieces = capture_pieces(model, capturer=_piece_capturer(), device=dev)
    try:
        for _ in range(warmup + 1):  # a piece that fails to capture is split on the next call
            run()
        if dev == "cuda":
            torch.cuda.synchronize()
        if not any(p["graphs"] for p in pieces.status().values()):
            raise ForgeError("no piece of the forward could be captured: " +
                             "; ".join(f"{k or 'the model'}: {v['refused'][0]}" for k, v in pieces.status().items()
                                       if v["refused"])[:400])
        out = run()
    except BaseException:
        pieces.undo()
        raise
    return run, out, pieces


def pieces_summary(pieces: Any) -> str:
    """Which modules run from graphs, and why the others do not (for the bench's notes)."""
    st = pieces.status()
    done = [k or "the model" for k, v in st.items() if v["graphs"]]
    refused = {k or "the model": v["refused"][0] for k, v in st.items() if v["refused"] and not v["graphs"]}
    text = f"{len(done)} modules from graphs ({', '.join(done[:6])}{', ...' if len(done) > 6 else ''})"
    if refused:
        text += "; run as written: " + "; ".join(f"{k} ({why})" for k, why in list(refused.items())[:4])
    return text


def _free_memory() -> None:
    """What the process no longer references, collected and handed back to the device (CUDA's
    caching allocator keeps freed blocks otherwise)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _release(variants: dict[str, Any], fns: dict[str, Any], names: tuple[str, ...]) -> None:
    """Drop the named variants (and their timed calls), then free the memory they held."""
    for name in names:
        variants.pop(name, None)
        fns.pop(name, None)
    _free_memory()


def _graph_variants(wl: Any, inputs: Any, models: tuple[Any, Any], timer: Timer, ref: Any, notes: list[str],
                    model: Any) -> tuple[dict[str, Stats], dict[str, list[float]], dict[str, str | None],
                                         dict[str, dict[str, Any]], dict[str, Any], list[Any]]:
    """Eager and eager + forge, each captured in a CUDA graph, timed interleaved with each other;
    eager's graph judged against eager, forge's against eager's graph. Also returns the replays,
    and the Pieces handles to undo when the forward could not be captured whole and both run in
    pieces (``piecewise_graphed``). Nothing where either fails (the reason in ``notes``)."""
    fns: dict[str, Any] = {}
    outs: dict[str, Any] = {}
    handles: list[Any] = []
    try:
        for name, m in zip(GRAPH_VARIANTS, models):
            fns[name], outs[name] = cuda_graphed(functools.partial(wl.run, m, inputs))
    except ForgeError as exc:
        # both variants the same way: in pieces, eager's on a copy (the eager model stays as it is)
        fns.clear()
        outs.clear()
        notes.append(f"CUDA graphs: the whole forward could not be captured ({exc}): both graphed variants "
                     "run in pieces (the modules that can be captured, from graphs; the rest as written)")
        for name, m in zip(GRAPH_VARIANTS, (copy.deepcopy(models[0]), models[1])):
            try:
                fn, outs[name], pieces = piecewise_graphed(functools.partial(wl.run, m, inputs), m)
            except ForgeError as exc2:
                notes.append(f"{name}: not even in pieces: {exc2}")
                for h in handles:
                    h.undo()
                return {}, {}, {}, {}, {}, []
            handles.append(pieces)
            fns[name] = fn
            notes.append(f"{name}: {pieces_summary(pieces)}")
    for fn in fns.values():
        fn()  # the outputs judged are the graphs' own, from a replay
    agree, accuracy = _judge_outputs(outs, ref, lambda: _run_fp32(wl, model, inputs))
    with GcPauses():
        stats, raw, _ = timer.time(fns)
    return stats, raw, agree, accuracy, fns, handles


def bench(workload_spec: Any, workspace: Any, *, device: str | None = None, dtype: Any = None, repeats: int = 20,
          warmup: int = 3, with_compile: bool = True, switch_off: bool = True, only_faster: bool = True,
          compile_backend: str = "inductor", graphs: bool = False, switch_off_compile: bool | None = None,
          own_process_check: bool = True, own_process_deadline: float | None = None) -> BenchResult:
    """The whole forward timed four ways (see the module's docstring). ``graphs`` (cuda): also
    eager and eager + forge captured in CUDA graphs (``GRAPH_VARIANTS``), which take the host's
    launch cost out of both: the ratio between them (paired, timed apart from the four ways, after
    them) is what the kernels save on the device. The graphed model gets the kernels as
    ``Mode.CUDA_GRAPH`` gives them, and with ``switch_off`` their verdict in graphs is decided on
    graphed forwards (``_switch_off_in_graphs``), apart from the op-by-op one.
    ``switch_off_compile``: the torch.compile verdict alone on or off (default: as ``switch_off``).
    ``own_process_check``: a verdict to keep the kernels in compiled models is confirmed in a
    process of its own (``fresh_compile_pair``), whose ratio is ``FRESH_COMPILE``; it must end by
    ``own_process_deadline`` (``time.time()``) where one is given."""
    import torch

    from .workload import load_workload, resolve_device
    from .workspace import Workspace

    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    dev = resolve_device(device)
    wl = load_workload(workload_spec)
    model, inputs = wl.build(dev, dtype)
    model.eval()
    folder = kernels_dir(ws)
    man = Manifest.load(folder)
    if not man.entries:
        raise ForgeError(f"{ws.root} has no promoted kernels (forge approve promotes them)")
    notes: list[str] = []
    variants: dict[str, Any] = {"eager": model}
    forge_model = copy.deepcopy(model)
    # no in-place trial: the bench times the whole forward both ways itself, interleaved
    applied = apply(forge_model, ws, mode=Mode.INFERENCE, device=dev, only_faster=only_faster, trial_calls=0)
    notes.extend(f"not used {c}: {why}" for c, why in applied.skipped.items())
    variants["eager+forge"] = forge_model
    graph_models: tuple[Any, Any] | None = None
    graph_applied = None
    if graphs and dev not in GRAPH_DEVICES:
        notes.append("CUDA graphs: not on this device")
    elif graphs:
        # the kernels as a captured model gets them: by their verdict in graphs, not op by op
        gm = copy.deepcopy(model)
        graph_applied = apply(gm, ws, mode=Mode.CUDA_GRAPH, device=dev, only_faster=only_faster)
        notes.extend(f"not used in CUDA graphs {c}: {why}" for c, why in graph_applied.skipped.items()
                     if "in CUDA graphs" in why)
        graph_models = (model, gm)
    compiled_applied = None
    if with_compile:
        variants["compile"] = torch.compile(copy.deepcopy(model), backend=compile_backend)
        cf = copy.deepcopy(model)
        compiled_applied = apply(cf, ws, mode=Mode.TORCH_COMPILE, device=dev, only_faster=only_faster)
        # module cards are custom ops in any compiled model; the apply's backend serves its op and
        # chain cards in the compiled graphs, then hands them to ``compile_backend``
        variants["compile+forge"] = torch.compile(cf, backend=compiled_applied.backend(compile_backend))
    timer = Timer(dev, warmup=warmup, repeats=repeats, cold_l2=False)
    graph_ratio: Stats | None = None
    with torch.no_grad():
        ref = wl.run(model, inputs)
        outs = {name: wl.run(m, inputs) for name, m in variants.items() if name != "eager"}
        pauses = GcPauses()
        fns = {name: (lambda m=m, n=name: pauses.run(n, wl.run, m, inputs)) for name, m in variants.items()}
        agree, accuracy = _judge_outputs(outs, ref, lambda: _run_fp32(wl, model, inputs))
        del outs
        with pauses:
            stats, raw, _ = timer.time(fns)
        notes.extend(pauses.notes())
        notes.extend(scope_notes(applied))
        # the compiled variants are done with (their verdict reads the timings, not the models):
        # their memory (inductor's buffers, the outputs they keep) goes back before the switch-off
        # times fresh copies and the graphs are captured: kept, it can leave the graphs' capture
        # out of memory and slow the switch-off's copies of the forward
        _release(variants, fns, ("compile", "compile+forge"))
        switched: dict[str, str] = {}
        after: Stats | None = None
        units: list[dict[str, Any]] = []
        if switch_off:
            switched, after = _switch_off_slower(wl, model, inputs, ws, man, applied, dev, timer, only_faster, stats, raw,
                                                 units)
            promised = _promised_us(ws, man, stats["eager"].median)
            for u in units:
                each = [promised.get(c) for c in u["cards"]]
                u["promised_us"] = None if any(v is None for v in each) else sum(v for v in each if v is not None)
        fresh: Stats | None = None
        if (switch_off if switch_off_compile is None else switch_off_compile) and compiled_applied is not None:
            def confirm() -> tuple[dict[str, list[float]], dict[str, int]] | str:
                limit = FRESH_TIMEOUT_S
                if own_process_deadline is not None:
                    import time

                    limit = min(limit, own_process_deadline - time.time())
                    if limit < FRESH_MIN_S:
                        return f"{max(limit, 0.0):.0f} s were left for it before the run's deadline"
                return fresh_compile_pair(workload_spec, ws, dev, dtype, repeats, warmup, compile_backend, only_faster,
                                          timeout_s=limit)

            off, fresh = _switch_off_under_compile(ws, man, compiled_applied, stats, raw, dev,
                                                   confirm=confirm if own_process_check else None)
            switched.update(off)
        if graph_models is not None and graph_applied is not None:  # last: a failed capture cannot disturb the above
            g_stats, g_raw, g_agree, g_acc, g_fns, g_pieces = _graph_variants(wl, inputs, graph_models, timer, ref,
                                                                               notes, model)
            stats.update(g_stats)
            agree.update(g_agree)
            accuracy.update(g_acc)
            if g_raw:
                graph_ratio = paired_ratio(g_raw[GRAPH_VARIANTS[0]], g_raw[GRAPH_VARIANTS[1]])
                if switch_off:
                    switched.update(_switch_off_in_graphs(wl, model, inputs, ws, man, graph_applied, dev, timer,
                                                          only_faster, g_stats, g_raw, g_fns, notes, bool(g_pieces)))
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
    return BenchResult(dev, stats, speedups, agree, _bound(ws, man, served), served, switched, notes, accuracy,
                       served_compiled, c_bound, units, own, own_bound(ws, man, served, eager_us, own),
                       bound_basis(stats))


def shares_note(ws: Any) -> str | None:
    """What the bound's shares are, where the profile's op cards, each timed alone, sum past the
    forward (a host that holds the forward back: each op alone pays its launch and its wait, which
    the forward overlaps): the bound from them then promises more than the forward holds. None
    where they do not. They are not scaled down to the forward: shares so scaled set bounds that
    the bundled workloads pass, where unscaled ones err high, and a bound that errs high is the one
    a verdict can trust (docs/runtime.md)."""
    cov = (ws.profile_summary().get("coverage") or {}).get("op")
    if not isinstance(cov, (int, float)) or cov <= 1.0:
        return None
    return (f"the op cards, each timed alone, sum to {100 * cov:.0f}% of the forward: the shares, and the "
            "bound from isolation, count each op's launch and wait where the forward overlaps them")


def _saved_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served card with a speedup and a share, the share of eager's forward its isolated
    speedup promises to save: share x (1 - 1/speedup), fold, experts and merge cards included (the
    share of a fold: its pairs' ``fold_shares``; of the others, ``config_shares``)."""
    shares = {c.id: c.share for c in ws.cards()}
    folds = fold_shares(ws, man, served) | config_shares(ws, man, served)
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        sp, share = e.evidence.speedup_vs_eager, folds.get(card, shares.get(card))
        if served.get(card) and sp and share:
            out[card] = share * (1 - 1 / sp)
    return out


def _bound(ws: Any, man: Manifest, served: dict[str, int]) -> float | None:
    """1 / (1 - sum of share x (1 - 1/speedup)) over the served cards (``_saved_shares``)."""
    saved = sum(_saved_shares(ws, man, served).values())
    return 1 / (1 - saved) if 0 < saved < 1 else None


def _promised_us(ws: Any, man: Manifest, eager_us: float) -> dict[str, float]:
    """Per promoted card, what its isolated speedup promises to save of eager's forward
    (``eager_us``, µs): ``_saved_shares`` x eager_us."""
    return {c: v * eager_us for c, v in _saved_shares(ws, man, {c: 1 for c in man.entries}).items()}


def own_saved_us(ws: Any, man: Manifest, served: dict[str, int], eager_us: float,
                 own: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Per served card, what it saves of eager's forward (``eager_us``, µs) by its own times
    (``card_own_us``: eager's ops for the card and the served call, on cuda the device's time
    alone): its calls a forward times the difference. A card without them (a fold, merge or
    experts card; one its guard would not serve on its captured inputs) counts what its isolated
    speedup and share promise (``_saved_shares``)."""
    calls = {c.id: c.calls for c in ws.cards()}
    promised = _saved_shares(ws, man, served)
    out: dict[str, float] = {}
    for card in man.entries:
        if not served.get(card):
            continue
        if card in own and calls.get(card):
            out[card] = calls[card] * (own[card][0] - own[card][1])
        elif card in promised:
            out[card] = promised[card] * eager_us
    return out


def own_bound(ws: Any, man: Manifest, served: dict[str, int], eager_us: float,
              own: dict[str, tuple[float, float]]) -> float | None:
    """eager's forward over eager's forward less what the served cards save by their own times
    (``own_saved_us``); None without such times, or where they save nothing."""
    if not own or eager_us <= 0:
        return None
    saved = sum(own_saved_us(ws, man, served, eager_us, own).values())
    return eager_us / (eager_us - saved) if 0 < saved < eager_us else None


DEVICE_BOUND = 0.9
"""eager's forward captured in CUDA graphs taking at least this fraction of its op-by-op time:
the host hides behind the device, and op by op the forward waits on its device."""


def bound_basis(times: dict[str, Stats]) -> str:
    """"own times" where eager's forward is bound by its device: replayed from CUDA graphs (the
    host's launches out) it takes at least ``DEVICE_BOUND`` of its op-by-op time. There a card
    saves the forward its device time, and the isolated speedups, whose clock runs from the host's
    call to the device's idle, overstate what a card with many small eager ops saves (the decoder's
    RMSNorm: 8 launches whose host time exceeds their device time). "isolation" otherwise (no
    graphed times; a forward bound by its host saves what the calls cost the host too)."""
    eager, graphed = times.get("eager"), times.get("eager (graph)")
    if eager is None or graphed is None or eager.median <= 0:
        return "isolation"
    return "own times" if graphed.median >= DEVICE_BOUND * eager.median else "isolation"


def card_own_us(ws: Any, applied: Any, cards: list[str], dev: str, reps: int = 15) -> dict[str, tuple[float, float]]:
    """Per card of ``cards`` that a guard of ``applied`` serves (module, op and chain cards whose
    captured inputs pass the guard), eager's ops for the card and the served call, one call each
    on the card's captured inputs, interleaved ``reps`` times (the served call once before, to see
    that it serves): their medians, µs. On cuda the device's time alone (``Timer.device_us``: the L2 flushed, the device held busy
    while the host enqueues, CUDA events around the call), the evaluator's cold caches; on the cpu
    the call's. Fold, merge and experts cards have none: their own calls are not a card's."""
    from . import timing
    from .inputs import sample_inputs
    from .program import run_program

    one = timing.Timer(dev, warmup=0, repeats=1, cold_l2=True).device_us if dev == "cuda" else timing.Timer._one_cpu
    out: dict[str, tuple[float, float]] = {}
    for cid in cards:
        guard = applied.guards.get(cid)
        card = ws.card(cid) if guard is not None else None
        if card is None or not card.samples:
            continue
        ins = sample_inputs(card, ws.store, 0, dev)
        if guard.mismatch(ins) or guard.serve(ins) is None:
            continue
        fns = {"eager": functools.partial(run_program, card.program, ins, dev),
               "served": functools.partial(guard.serve, ins)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                times[name].append(one(fn))
        if guard.status.active:  # a kernel that failed meanwhile fell back: its times are eager's
            out[cid] = (Stats.from_samples(times["eager"]).median, Stats.from_samples(times["served"]).median)
    return out


def compile_bound(ws: Any, man: Manifest, served: dict[str, int], compile_us: float) -> float | None:
    """What the cards served under torch.compile can give over its forward (``compile_us``, µs):
    each card's calls a forward times torch.compile's own time for the card in isolation (its
    kernels' device time where the evaluator had it), less the kernel's at its isolated speedup
    over torch.compile, summed over the cards, the forward's time over what is left. A card
    without torch.compile's time in its evidence (fold, merge, experts) counts nothing: an upper
    estimate, since torch.compile may fuse a card with its neighbours in the model, where the
    isolated card cannot. None where no served card has the numbers."""
    calls = {c.id: c.calls for c in ws.cards()}
    saved, counted = 0.0, False
    for card, e in man.entries.items():
        ev = e.evidence
        base = ev.compile_device_us if ev.compile_basis == "device" and ev.compile_device_us else ev.compile_us
        sp, n = ev.speedup_vs_compile, calls.get(card, 0)
        if served.get(card) and sp and base and n:
            saved += n * base * (1 - 1 / sp)
            counted = True
    if not counted or compile_us <= 0 or saved >= compile_us:
        return None
    return compile_us / (compile_us - saved)


def fold_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served fold card, the share of the forward its pairs took in eager: at each pair's two
    modules, their module cards' shares per site, or the op cards' profiled there where a module
    has none (a fold's evidence times the pair, convolution and batch norm, against the folded
    convolution)."""
    per_site: dict[str, float] = {}
    ops_at: dict[str, float] = {}
    """The op cards profiled in a module: its share where it has no module card of its own."""
    for c in ws.cards():
        if c.module_paths and c.share:
            into = per_site if c.kind == CardKind.MODULE else ops_at
            for p in c.module_paths:
                into[p] = into.get(p, 0.0) + c.share / len(c.module_paths)
    for p, share in ops_at.items():
        per_site.setdefault(p, share)
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        if e.signature.kind != CardKind.FOLD or not served.get(card):
            continue
        try:
            pairs = json.loads((kernels_dir(ws) / e.source).read_text())["pairs"]
        except (OSError, ValueError, KeyError):
            continue
        at = [Pair(p["parent"], p["conv"], p["bn"], "") for p in pairs]
        sites = [s for p in at for s in (p.conv_path, p.bn_path)]
        out[card] = sum(per_site.get(s, 0.0) for s in sites)
    return out


def config_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served card of a rewrite whose configuration records its share (``Rewrite.share_in_config``:
    experts, merge), its sites' share of the forward in eager, as ``forge experts`` and ``forge
    merge`` measured it (the sites' calls times their own time, over the forward's)."""
    kinds = {r.kind for r in REWRITES.values() if r.share_in_config}
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        if e.signature.kind not in kinds or not served.get(card):
            continue
        try:
            share = json.loads((kernels_dir(ws) / e.source).read_text()).get("share")
        except (OSError, ValueError):
            continue
        if isinstance(share, (int, float)) and share > 0:
            out[card] = float(share)
    return out


def scope_notes(applied: Any) -> list[str]:
    """What each compiled scope ran as (Dynamo's torch-level graph or the aten graph, per graph
    compiled) and the sites a torch-level graph left unserved, with why."""
    out = []
    for path, scope in sorted(applied.scopes.items()):
        if scope.levels:
            if scope.direct is not None:
                how = f"; Dynamo's code called directly ({scope.direct.calls} of its {scope.calls} calls)"
            else:
                how = f"; Dynamo ran every call: {scope.direct_why}" if scope.direct_why else ""
            if scope.rehooks:
                how += f"; compiled again {scope.rehooks} time(s) for changed module hooks"
            if scope.failed:
                how += f"; runs as written since: {scope.failed}"
            if scope.stopped:
                how += f"; compiles no more variants ({scope.stopped})"
            if scope.uncovered:
                how += f"; {scope.uncovered} calls at shapes no served variant covers ran as written"
            out.append(f"compiled scope {path or 'the model'}: ran as {', '.join(scope.levels)} graph"
                       f"{'s' if len(scope.levels) > 1 else ''}{how}")
        out.extend(f"compiled scope {path or 'the model'}: {card} not served there: {why}"
                   for card, why in sorted(scope.unmapped.items()))
    return out


FRESH_COMPILE = "compile+forge/compile (own process)"
"""The speedup key of torch.compile / torch.compile + forge timed in a process of their own
(``fresh_compile_pair``), where the bench's process kept forge's kernels in compiled models."""

FRESH_TIMEOUT_S = 900.0
"""The process of its own: two compiles of the model with a cold inductor cache (tens of seconds
each for a ResNet-50) and the timing."""
FRESH_MIN_S = 10.0
"""Less time than this before the deadline: the process of its own is not started (the kernels go
off in compiled models, unconfirmed)."""


def fresh_compile_pair(workload_spec: Any, ws: Any, dev: str, dtype: Any, repeats: int, warmup: int,
                       backend: str, only_faster: bool, timeout_s: float = FRESH_TIMEOUT_S,
                       ) -> tuple[dict[str, list[float]], dict[str, int]] | str:
    """torch.compile and torch.compile + forge timed in a process of their own
    (``python -m forge_tui.compile_pair``): (their samples, the calls served per card), or why
    there are none."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not isinstance(workload_spec, (str, Path)):
        return "the workload is not a file a process of its own can load"
    cmd = [sys.executable, "-m", "forge_tui.compile_pair", str(workload_spec), str(ws.root), "--device", dev,
           "--repeats", str(repeats), "--warmup", str(warmup), "--backend", backend]
    if dtype is not None:
        cmd += ["--dtype", str(dtype).removeprefix("torch.")]
    if not only_faster:
        cmd.append("--all-kernels")
    # the same forge_tui as this process's, installed or not
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"it did not finish in {timeout_s:.0f} s"
    except OSError as exc:
        return f"it did not start: {exc}"
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    try:
        got = json.loads(last) if done.returncode == 0 else None
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(k in got.get("raw", {}) for k in ("compile", "compile+forge")):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"it exited with status {done.returncode}: {tail[:300]}"
    return got["raw"], got.get("served", {})


def _switch_off_under_compile(ws: Any, man: Manifest, compiled_applied: Any, stats: dict[str, Any],
                              raw: dict[str, list[float]], dev: str,
                              confirm: Callable[[], tuple[dict[str, list[float]], dict[str, int]] | str] | None = None,
                              ) -> tuple[dict[str, str], Stats | None]:
    """torch.compile + forge never below torch.compile: unless the compiled forward ran faster with
    forge's kernels than without (``not_faster``), every kernel it served is switched off for compiled models
    (eager models keep them). All at once: leaving each out in turn would compile the model once a
    kernel. Where this process finds them faster, ``confirm()`` (``fresh_compile_pair``'s result)
    times the two again in a process of their own, whose verdict stands: this process's
    torch.compile is no sound baseline (``compile_pair``); a confirmation that fails switches them
    off too. Returns the cards switched off with why, and the ratio of the process of their own."""
    c, cf = stats.get("compile"), stats.get("compile+forge")
    served = [s["card"] for s in compiled_applied.status()["cards"] if s["served"]]
    if c is None or cf is None or not served:
        return {}, None
    ratio = paired_ratio(raw["compile"], raw["compile+forge"])
    fresh: Stats | None = None
    here = (f"the compiled forward ran {cf.median:.1f} µs with forge's kernels and {c.median:.1f} µs without, "
            f"{ratio.median:.3f}x [{ratio.q1:.3f}, {ratio.q3:.3f}] paired (forge bench, {dev})")
    if not not_faster(ratio):
        if confirm is None:
            return {}, None
        got = confirm()
        if isinstance(got, str):
            why = f"{here}, but timing it again in a process of its own failed: {got}"
        else:
            fresh = paired_ratio(got[0]["compile"], got[0]["compile+forge"])
            if not not_faster(fresh):
                return {}, fresh
            fc, ff = Stats.from_samples(got[0]["compile"]), Stats.from_samples(got[0]["compile+forge"])
            why = (f"in a process of its own the compiled forward ran {ff.median:.1f} µs with forge's kernels and "
                   f"{fc.median:.1f} µs without, {fresh.median:.3f}x [{fresh.q1:.3f}, {fresh.q3:.3f}] paired "
                   f"(forge bench's own process had measured {ratio.median:.3f}x; {dev})")
    else:
        why = here
    for card in served:
        man.entries[card].compile_disabled_reason = why
    commit_manifest(ws, man, "switch-off", f"switch off {kernels(len(served))} under torch.compile",
                    [f"{card}: {why}" for card in served], served)
    return {f"{card} (under torch.compile)": why for card in served}, fresh


def not_faster(ratio: Stats) -> bool:
    """Whether kernels failed to pay in the whole forward: the paired ratio (without / with) has a
    median below 1. Kernels are used only where they measured faster in the model, so a ratio
    whose median misses 1 switches them off even while its upper quartile reaches it: a ratio
    that straddles 1 is no evidence that they pay."""
    return ratio.median < 1.0


def switch_off_units(man: Manifest, served: list[str]) -> list[list[str]]:
    """The served cards grouped into what can be left out on its own: a module card or a rewrite's
    alone, or all of a rewrite's cards together where it is ``switched_off_together``; op
    cards that share an interceptor scope together (while one of them is served the scope is
    intercepted, and that costs every op in it, so leaving one out alone shows nothing)."""
    units: list[list[str]] = []
    scopes: list[set[str]] = []
    together = [r.kind for r in REWRITES.values() if r.switched_off_together]
    for kind in together:
        # one unit each (``Rewrite.switched_off_together``): a model's folds are many, and its
        # merges (a few per layer), each saving a little
        same = [c for c in served if man.entries[c].signature.kind == kind]
        if same:
            units.append(same)
            scopes.append(set())
    for card in served:
        sig = man.entries[card].signature
        if sig.kind in together:
            continue
        if sig.kind not in (CardKind.OP, CardKind.CHAIN):  # a module card or a rewrite's: alone
            units.append([card])
            scopes.append(set())
            continue
        mine = set(sig.module_paths or [""])
        merged, merged_scopes = [card], set(mine)
        for i in reversed(range(len(units))):
            if scopes[i] & merged_scopes:
                merged = units.pop(i) + merged
                merged_scopes |= scopes.pop(i)
        units.append(merged)
        scopes.append(merged_scopes)
    return units


def _time_against(wl: Any, inputs: Any, ws: Any, dev: str, timer: Timer, only_faster: bool, base: Any, model: Any,
                  cards: list[str], names: tuple[str, str]) -> tuple[Stats, Stats, Stats]:
    """``base``'s forward and that of a copy of ``model`` serving ``cards``, timed interleaved
    (named ``names`` to the timer), and their paired ratio base / other."""
    other = copy.deepcopy(model)
    applied = apply(other, ws, device=dev, cards=cards, only_faster=only_faster, trial_calls=0)
    try:
        # as the bench times its variants: the collector's scans kept off what exists before (each
        # trial adds a copy of the model, and without this every later trial pays for scanning the
        # earlier ones' copies, slowing its forward unit by unit)
        with GcPauses():
            stats, raw, _ = timer.time({names[0]: functools.partial(wl.run, base, inputs),
                                        names[1]: functools.partial(wl.run, other, inputs)})
    finally:
        applied.undo()
    return stats[names[0]], stats[names[1]], paired_ratio(raw[names[0]], raw[names[1]])


def _unit_times(wl: Any, inputs: Any, ws: Any, dev: str, timer: Timer, only_faster: bool, model: Any,
                served: list[str], unit: list[str]) -> tuple[Stats, Stats]:
    """The forward with every served kernel and without ``unit``'s, timed interleaved, both sides
    fresh copies of ``model`` applied alike (no copy carries what earlier units ran on it: one
    copy with every kernel, kept for every unit, runs slower than the bench's own copy with the
    same kernels, and its slowness would switch off units that pay)."""
    with_all = copy.deepcopy(model)
    a = apply(with_all, ws, device=dev, cards=served, only_faster=only_faster, trial_calls=0)
    try:
        w, wo, _ = _time_against(wl, inputs, ws, dev, timer, only_faster, with_all, model,
                                 [c for c in served if c not in unit], ("with", "without"))
    finally:
        a.undo()
        del with_all
        _free_memory()  # the copies' memory back before the next unit's
    return w, wo


def _switch_off_slower(wl: Any, model: Any, inputs: Any, ws: Any, man: Manifest, applied: Any, dev: str,
                       timer: Timer, only_faster: bool, stats: dict[str, Stats],
                       raw: dict[str, list[float]], units_log: list[dict[str, Any]] | None = None,
                       ) -> tuple[dict[str, str], Stats | None]:
    """Leave each unit of served kernels (``switch_off_units``) out in turn; one whose absence
    makes the forward faster (by more than the spread of the measurement), twice on fresh copies,
    is switched off in the manifest, with the numbers. Then the kernels left, together, against eager: unless the forward
    is faster with them (``not_faster``), they are all switched off. ``stats`` and ``raw``: the bench's timing of "eager" and
    "eager+forge", which stands for that check when no unit was switched off. ``units_log``, where
    given, gets each unit's first measurement (its cards, the forward's medians with and without).

    Where that check's paired ratio has a median below 1 but an upper quartile above it, the
    forward is timed again, twice as long, and that measurement decides.

    Returns what was switched off and why, and, where some kernels were switched off and others
    stay (or the check was measured again), the paired ratio eager / eager + forge measured with
    those left (what the model runs from now on; where all are off it runs eager's own code:
    ``apply`` installs nothing)."""
    served = [c["card"] for c in applied.status()["cards"] if c["served"]]
    if not served:
        return {}, None
    out: dict[str, str] = {}
    units = switch_off_units(man, served)
    if len(units) > 1:
        for unit in units:
            w, wo = _unit_times(wl, inputs, ws, dev, timer, only_faster, model, served, unit)
            if units_log is not None:
                units_log.append({"cards": list(unit), "with_us": w.median, "without_us": wo.median})
            if wo.q3 < w.q1:  # faster without it, beyond the spread of both
                # once more, on another pair of fresh copies: one pair alone can run far slower
                # than the bench's own copies with the same kernels, and switch off a kernel that
                # pays
                w2, wo2 = _unit_times(wl, inputs, ws, dev, timer, only_faster, model, served, unit)
                if not wo2.q3 < w2.q1:
                    continue
                together = (f" (with {', '.join(c for c in unit)}: they share a scope, served together)"
                            if len(unit) > 1 else "")
                for card in unit:
                    out[card] = (f"the forward ran {w.median:.1f} µs with it and {wo.median:.1f} µs without, "
                                 f"then {w2.median:.1f} and {wo2.median:.1f} on fresh copies{together} "
                                 f"(forge bench, {dev})")
    left = [c for c in served if c not in out]
    after: Stats | None = None
    if left:
        if out:
            e, f, ratio = _time_against(wl, inputs, ws, dev, timer, only_faster, model, model, left,
                                        ("eager", "forge"))
        else:  # the bench timed exactly these already
            e, f, ratio = stats["eager"], stats["eager+forge"], paired_ratio(raw["eager"], raw["eager+forge"])
        again = ""
        if not_faster(ratio) and ratio.q3 > 1.0:
            # the quartiles straddle 1 (a noisy host, where eager's own forwards spread wide and
            # one short measurement would switch every kernel off): one more measurement, twice
            # as long, decides
            first = ratio
            longer = Timer(timer.device, warmup=timer.warmup, repeats=2 * timer.repeats, cold_l2=timer.cold_l2)
            e, f, ratio = _time_against(wl, inputs, ws, dev, longer, only_faster, model, model, left,
                                        ("eager", "forge"))
            again = (f"; measured again, {2 * timer.repeats} forwards, after {first.median:.3f}x "
                     f"[{first.q1:.3f}, {first.q3:.3f}]")
        if not_faster(ratio):  # the kernels left, together, do not make the forward faster
            for card in left:
                out[card] = (f"the forward ran {f.median:.1f} µs with the {len(left)} kernels left and "
                             f"{e.median:.1f} µs in eager (forge bench, {dev}{again})")
        elif out or again:
            after = ratio  # what the model runs with from now on, measured
    if out:
        for card, why in out.items():
            man.entries[card].enabled = False
            man.entries[card].disabled_reason = why
        commit_manifest(ws, man, "switch-off", f"switch off {kernels(len(out))} slower end to end",
                        [f"{c}: {w}" for c, w in out.items()], list(out))
    return out, after


class GcPauses:
    """The garbage collector's pauses during timed forwards, by variant (``gc.callbacks``); while
    active, what the process had built before (models, compiled graphs) is frozen out of the
    collector's scans (``gc.freeze``, as a server does once it has loaded), so that no variant pays
    for scanning another's objects. A collection during a timed forward is rare; the notes say so
    where one runs."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.pauses: dict[str, list[float]] = {}
        self._t0 = 0

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        self.current = name
        try:
            return fn(*args)
        finally:
            self.current = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        import time

        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self.current is not None:
            self.pauses.setdefault(self.current, []).append((time.perf_counter_ns() - self._t0) / 1e6)

    def __enter__(self) -> "GcPauses":
        import gc

        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        gc.callbacks.remove(self._callback)
        gc.unfreeze()

    def notes(self) -> list[str]:
        return [f"garbage collection in the timed {name} forwards: {len(ms)} pauses, {sum(ms):.1f} ms in all, "
                f"the longest {max(ms):.1f} ms" for name, ms in sorted(self.pauses.items()) if ms]


class _Undo:
    """Undoes several handles, last first."""

    def __init__(self, *handles: Any) -> None:
        self.handles = handles

    def undo(self) -> None:
        for h in self.handles:
            h.undo()


def _switch_off_in_graphs(wl: Any, model: Any, inputs: Any, ws: Any, man: Manifest, graph_applied: Any, dev: str,
                          timer: Timer, only_faster: bool, stats: dict[str, Stats], raw: dict[str, list[float]],
                          fns: dict[str, Any], notes: list[str], in_pieces: bool = False) -> dict[str, str]:
    """``_switch_off_slower`` for models captured in CUDA graphs: each unit of the kernels the
    graphed model served left out in turn (a graph captured without it, timed interleaved with the
    graph of them all), then the kernels left against eager's graph. What it switches off is
    switched off in graphs only (``Entry.graph_disabled_reason``); the op-by-op verdict stands."""
    served = [c["card"] for c in graph_applied.status()["cards"] if c["served"]]
    if not served:
        return {}
    eager_name, forge_name = GRAPH_VARIANTS

    def graphed(cards: list[str]) -> Any:
        """(the graphed forward, its undo) for a copy of the model serving ``cards``, captured as the
        bench's graphed variants were (whole, or in pieces)."""
        m = copy.deepcopy(model)
        a = apply(m, ws, mode=Mode.CUDA_GRAPH, device=dev, cards=cards, only_faster=only_faster)
        try:
            if in_pieces:
                fn, _, pieces = piecewise_graphed(functools.partial(wl.run, m, inputs), m)
                return fn, _Undo(pieces, a)
            return cuda_graphed(functools.partial(wl.run, m, inputs))[0], a
        except ForgeError as exc:
            a.undo()
            notes.append(f"CUDA graphs: a forward serving {len(cards)} of the kernels could not be captured: {exc}")
            return None, None

    out: dict[str, str] = {}
    units = switch_off_units(man, served)
    if len(units) > 1:
        for unit in units:
            fn, a = graphed([c for c in served if c not in unit])
            if fn is None:
                continue
            try:
                st, _, _ = timer.time({"with": fns[forge_name], "without": fn})
            finally:
                a.undo()
                del fn
            w, wo = st["with"], st["without"]
            if wo.q3 < w.q1:  # faster without it, beyond the spread of both
                together = f" (with {', '.join(unit)}: they share a scope, served together)" if len(unit) > 1 else ""
                for card in unit:
                    out[card] = (f"the graphed forward ran {w.median:.1f} µs with it and {wo.median:.1f} µs "
                                 f"without{together} (forge bench --graphs)")
    left = [c for c in served if c not in out]
    if left:
        if out:
            fn, a = graphed(left)
            if fn is None:
                ratio = None
            else:
                try:
                    st, r, _ = timer.time({"eager": fns[eager_name], "forge": fn})
                finally:
                    a.undo()
                    del fn
                e, f, ratio = st["eager"], st["forge"], paired_ratio(r["eager"], r["forge"])
        else:  # the bench timed exactly these already
            e, f, ratio = stats[eager_name], stats[forge_name], paired_ratio(raw[eager_name], raw[forge_name])
        if ratio is not None and not_faster(ratio):
            for card in left:
                out[card] = (f"the graphed forward ran {f.median:.1f} µs with the {len(left)} kernels left and "
                             f"{e.median:.1f} µs in eager's graph (forge bench --graphs)")
    if out:
        for card, why in out.items():
            man.entries[card].graph_disabled_reason = why
        commit_manifest(ws, man, "switch-off", f"switch off {kernels(len(out))} in CUDA graphs",
                        [f"{c}: {w}" for c, w in out.items()], list(out))
    return {f"{card} (in CUDA graphs)": why for card, why in out.items()}
