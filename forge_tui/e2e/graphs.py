"""Forwards captured in CUDA graphs, whole or piece by piece, and the graphed variants of the
bench (eager and eager + forge replayed from graphs)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..errors import ForgeError
from ..runtime.pieces import end_failed_capture as _end_failed_capture
from ..timing import Stats, Timer
from .accuracy import judge_outputs, run_fp32
from .memory import GcPauses

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
    from ..runtime.pieces import CudaCapturer

    return CudaCapturer()


def piecewise_graphed(run: Any, model: Any, warmup: int = 3) -> tuple[Any, Any, Any]:
    """(run, its output, the Pieces handle): ``model``'s forward replayed from CUDA graphs piece
    by piece (``runtime.pieces``), for a forward that cannot be captured whole; its first calls
    capture the pieces. ``run`` calls the model, so its host work outside the pieces stays. Raises
    ForgeError when no piece could be captured; the caller undoes the handle."""
    import torch

    from ..runtime.pieces import capture_pieces

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


def graph_variants(wl: Any, inputs: Any, models: tuple[Any, Any], timer: Timer, ref: Any, notes: list[str],
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
    agree, accuracy = judge_outputs(outs, ref, lambda: run_fp32(wl, model, inputs))
    with GcPauses():
        stats, raw, _ = timer.time(fns)
    return stats, raw, agree, accuracy, fns, handles
