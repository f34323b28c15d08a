"""The switch-off in CUDA graphs: the eager switch-off's units and verdict, decided on graphed
forwards, recorded as switched off in graphs only."""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..errors import ForgeError
from ..promotion import commit_manifest, kernels
from ..runtime.apply import Mode, apply
from ..runtime.manifest import Manifest
from ..timing import Stats, Timer, paired_ratio
from . import graphs
from .switch_off import not_faster, switch_off_units


class _Undo:
    """Undoes several handles, last first."""

    def __init__(self, *handles: Any) -> None:
        self.handles = handles

    def undo(self) -> None:
        for h in self.handles:
            h.undo()


def switch_off_in_graphs(wl: Any, model: Any, inputs: Any, ws: Any, man: Manifest, graph_applied: Any, dev: str,
                          timer: Timer, only_faster: bool, stats: dict[str, Stats], raw: dict[str, list[float]],
                          fns: dict[str, Any], notes: list[str], in_pieces: bool = False) -> dict[str, str]:
    """``switch_off_slower`` for models captured in CUDA graphs: each unit of the kernels the
    graphed model served left out in turn (a graph captured without it, timed interleaved with the
    graph of them all), then the kernels left against eager's graph. What it switches off is
    switched off in graphs only (``Entry.graph_disabled_reason``); the op-by-op verdict stands."""
    served = [c["card"] for c in graph_applied.status()["cards"] if c["served"]]
    if not served:
        return {}
    eager_name, forge_name = graphs.GRAPH_VARIANTS

    def graphed(cards: list[str]) -> Any:
        """(the graphed forward, its undo) for a copy of the model serving ``cards``, captured as the
        bench's graphed variants were (whole, or in pieces)."""
        m = copy.deepcopy(model)
        a = apply(m, ws, mode=Mode.CUDA_GRAPH, device=dev, cards=cards, only_faster=only_faster)
        try:
            if in_pieces:
                fn, _, pieces = graphs.piecewise_graphed(functools.partial(wl.run, m, inputs), m)
                return fn, _Undo(pieces, a)
            return graphs.cuda_graphed(functools.partial(wl.run, m, inputs))[0], a
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
