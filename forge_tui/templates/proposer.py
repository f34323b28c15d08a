"""TemplateProposer: the built-in Proposer. Children are transformations of the parent's
configuration (one axis moved one step), tried in a fixed order of expected benefit; the first
child of the root is the family's heuristic choice for the card's shape. The families see the GPU
through one DeviceProps, the proposer's."""

from __future__ import annotations

import threading

from ..cards import Card
from ..kernels.device import DeviceProps, detect_device
from ..kernels.family import Family, Match, describe, parse_header
from ..search.proposer import Proposal, ProposalContext
from .coverage import has_point, valid_points, why_none
from .registry import match, matches

AXIS_ORDER = ("mode", "launch", "math", "vec", "owv", "tpr", "rpb", "rpt", "cache", "threads", "bps", "load", "rows", "cl", "segs", "chunk", "cblock",
              "grid", "unroll", "per_thread", "simd")


class TemplateProposer:
    name = "templates"

    def __init__(self, device: DeviceProps | None = None) -> None:
        """``device``: the GPU the candidates are for; by default the one found on first use
        (detect_device: DEFAULT_DEVICE where no CUDA device is present)."""
        self._device = device
        self._handed: dict[str, set[str]] = {}  # moves given out, recorded or still in flight
        self._lock = threading.Lock()
        self._kernels: dict[tuple, list[dict]] = {}  # _kernel_points, a family and card each

    @property
    def device(self) -> DeviceProps:
        if self._device is None:
            self._device = detect_device()  # (two threads may both detect: the same answer)
        return self._device

    def supports(self, card: Card, backend: str) -> str | None:
        fam, m = match(card)
        return why_none(card, fam, m, backend, self.device)

    def first_kernel(self, card: Card, backend: str) -> str | None:
        """The source of the family's first choice for the card (what the root's first template child
        is), or None where no family serves it: the LLM agent starts from it."""
        fam, m = match(card)
        if fam is None or m is None or not self.has_point(fam, m, backend):
            return None
        p = fam.initial(m, backend, self.device)
        return fam.render(m, p, backend, self.device) if fam.valid(m, p, backend, self.device) else None

    def has_point(self, fam: Family, m: Match, backend: str) -> bool:
        """Whether the family has a valid configuration for the matched card on this backend."""
        return has_point(fam, m, backend, self.device)

    def _kernel_points(self, fam: Family, m: Match, backend: str) -> list[dict]:
        """The family's distinct kernels for the card: of its valid configurations, the first (in
        the axes' product order) for each set of the parameters that change the kernel
        (``Family.relevant``). Found once a card and kept: the softmax family's axes make 450,000
        configurations, 95,000 of them valid but 221 distinct kernels, and going through them takes
        over a second, too long to repeat at every proposal."""
        key = (fam.name, m.card.id, backend, self.device)
        got = self._kernels.get(key)
        if got is None:
            seen: set[tuple] = set()
            got = []
            for p in valid_points(fam, m, backend, self.device):
                k = tuple(sorted(fam.relevant(p).items()))
                if k not in seen:
                    seen.add(k)
                    got.append(p)
            got = self._kernels.setdefault(key, got)  # two threads may both look: the same answer
        return got

    def neighbours(self, fam: Family, m: Match, params: dict, backend: str) -> list[dict]:
        """Configurations one step away on one axis, most promising axes first."""
        device = self.device
        axes = fam.axes(m, backend, device)
        out = []
        for axis in sorted(axes, key=lambda a: AXIS_ORDER.index(a) if a in AXIS_ORDER else 99):
            values = axes[axis]
            if axis not in params or params[axis] not in values:
                continue
            k = values.index(params[axis])
            steps = [values[j] for j in (k + 1, k - 1) if 0 <= j < len(values)]
            if axis in ("mode", "math"):  # no order among the values: each is one step away
                steps = [v for v in values if v != params[axis]]
            for v in steps:
                q = dict(params, **{axis: v})
                if axis == "mode":
                    # a mode change takes the settings the family gives that mode (a thread count
                    # right for one mode can spill or starve another)
                    tuned = dict(q, **fam.mode_settings(m, v, backend, device))
                    q = tuned if fam.valid(m, tuned, backend, device) else q
                if fam.valid(m, q, backend, device):
                    out.append(q)
                elif axis == "mode":  # a new mode may need other settings: the nearest valid ones
                    same_mode = [c for c in self._kernel_points(fam, m, backend) if c.get("mode") == v]
                    if same_mode:
                        near = min(same_mode, key=lambda c: sum(c[k] != params.get(k) for k in fam.relevant(c)))
                        # the parent's values where they do not change the kernel, as a move keeps them
                        rel = fam.relevant(near)
                        kept = {**near, **{k: params[k] for k in near if k in params and k not in rel}}
                        out.append(kept if fam.valid(m, kept, backend, device) else near)
        return out

    def _firsts(self, found: list[tuple[Family, Match]], backend: str) -> list[tuple[Family, Match, dict]]:
        """Each family's first choice, where it has a valid one."""
        out = []
        for fam, m in found:
            if self.has_point(fam, m, backend):
                p = fam.initial(m, backend, self.device)
                if fam.valid(m, p, backend, self.device):
                    out.append((fam, m, p))
        return out

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        """The root's children: the first family's first choice, then the generator's where it
        serves the card too (a hand-written family keeps priority, not the card: the generator's
        kernel was faster than the rms_norm family's on some shapes), then the first family's
        moves and points. A node's children: moves within its own family; from a node of the first
        family, the switch to the generator's first choice first, once a card."""
        found = matches(ctx.card)
        if not found:
            return None
        backend, device = ctx.backend, self.device
        parent = parse_header(ctx.parent.source) if ctx.parent.id != "root" else None
        candidates: list[tuple[Family, Match, dict]] = []
        if parent is None:
            fam, m = found[0]
            first = fam.initial(m, backend, device)
            candidates.append((fam, m, first))
            candidates += self._firsts(found[1:], backend)
            candidates += [(fam, m, p) for p in self.neighbours(fam, m, first, backend)
                           + self._kernel_points(fam, m, backend)]
        else:
            fam, m = next(((f, mm) for f, mm in found if mm.family == parent.get("family")), found[0])
            if fam is found[0][0]:
                # the switch to the generator is a move too, from the first family's kernels (once
                # a card: the search widens the root only after a few visits, and a budget of two
                # evaluations a card expands the first child)
                candidates += self._firsts(found[1:], backend)
            candidates += [(fam, m, p) for p in self.neighbours(fam, m, parent["params"], backend)]
        with self._lock:
            handed = self._handed.setdefault(ctx.card.id, set())
            handed.update(ctx.tree_moves)
            chosen = None
            for fam, m, p in candidates:
                move = describe(m.family, fam.relevant(p))
                if move not in handed:
                    handed.add(move)
                    chosen = (fam, m, p, move)
                    break
        if chosen is not None:
            fam, m, p, move = chosen
            source = fam.render(m, p, backend, device)
            return Proposal(source=source, move=move, meta={"family": m.family, "params": p,
                                                              "passes": fam.passes(m, p)})
        return None
