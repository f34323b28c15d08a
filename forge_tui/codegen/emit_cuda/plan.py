"""What a reduction kernel's phases read again (the cached loads), how later phases start from
what earlier ones computed (``Carry``), and the shared memory the ``smem`` cache takes."""

from __future__ import annotations

from dataclasses import dataclass

from ...kernel_abi import ITEMSIZE
from ..ir import Kernel
from .common import vec_ok


def cached_loads(kern: Kernel) -> list[int]:
    """Varying float loads that more than one phase reads (what the cache keeps)."""
    hit = kern.memo.get("cached_loads")
    if hit is None:
        hit = kern.memo["cached_loads"] = _cached_loads(kern)
    return list(hit)


def _cached_loads(kern: Kernel) -> list[int]:
    uses: dict[int, set[int]] = {}
    roots_by_phase = [[r.body for r in kern.reductions if r.level == lv] for lv in range(kern.levels)]
    roots_by_phase.append([o.node for o in kern.outputs if not o.per_row])
    for ph, roots in enumerate(roots_by_phase):
        for n in loop_nodes(kern, roots):
            node = kern.nodes[n]
            if node.op == "load" and node.kind == "f":
                uses.setdefault(n, set()).add(ph)
    return sorted(n for n, phases in uses.items() if len(phases) > 1)


def loop_nodes(kern: Kernel, roots: list[int]) -> list[int]:
    return [n for n in kern.needed(roots) if kern.nodes[n].varying]


def _phase_roots(kern: Kernel) -> list[list[int]]:
    """The nodes each loop over a row's columns computes: the reductions of each level, then the
    full (not per-row) outputs."""
    phases = [[r.body for r in kern.reductions if r.level == lv] for lv in range(kern.levels)]
    return phases + [[o.node for o in kern.outputs if not o.per_row]]


@dataclass
class Carry:
    """How the register cache carries a row from loop to loop. Without it (``recompute``), a
    later loop recomputes every value it needs from the cached loads: the attention chain's
    scale, mask and rounding three times and its exponential twice, which leaves the kernel bound
    by instructions far from its memory floor. With it, a loop keeps in
    registers the values a later loop reads (``keep``: node ids), and the later loop starts from
    them; arithmetic and rounding are the same, done once."""

    need: list[list[int]]
    """Per loop: the varying nodes it computes or reads from the cache, in order."""
    keep: list[list[int]]
    """Per loop: the non-load nodes it computes and stores for a later loop."""
    loads: list[int]
    """The loads more than one loop reads (kept in the load cache)."""

    @property
    def arrays(self) -> int:
        """The most register arrays (one per kept node or cached load) live at once."""
        live = 0
        for i in range(1, len(self.need)):
            later = {n for ph in self.need[i:] for n in ph}
            earlier = {n for ph in self.need[:i] for n in ph}
            live = max(live, len(later & earlier))
        return live


def carry_plan(kern: Kernel) -> Carry:
    """Each loop computes only the values no earlier loop computed, and reads the rest from
    registers (see ``Carry``)."""
    hit = kern.memo.get("carry")
    if hit is None:
        hit = kern.memo["carry"] = _carry_plan(kern)
    return hit


def _carry_plan(kern: Kernel) -> Carry:
    computed: set[int] = set()
    needs: list[list[int]] = []
    keep_at: dict[int, int] = {}  # kept node -> the loop that computes it
    first: dict[int, int] = {}
    for ph, roots in enumerate(_phase_roots(kern)):
        seen: set[int] = set()
        stack = [n for n in roots if kern.nodes[n].varying]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in computed:
                if kern.nodes[n].op != "load":
                    keep_at[n] = first[n]
                continue  # read from registers: its operands are not needed again
            stack.extend(a for a in kern.nodes[n].args if kern.nodes[n].varying and kern.nodes[a].varying)
        need = sorted(seen)
        for n in need:
            first.setdefault(n, ph)
        computed |= seen
        needs.append(need)
    keep = [sorted(n for n, ph in keep_at.items() if ph == i) for i in range(len(needs))]
    uses: dict[int, int] = {}
    for need in needs:
        for n in need:
            if kern.nodes[n].op == "load" and kern.nodes[n].kind == "f":
                uses[n] = uses.get(n, 0) + 1
    return Carry(needs, keep, sorted(n for n, c in uses.items() if c > 1))


def carries(kern: Kernel, cache: str) -> bool:
    """Whether a configuration's loops carry values (``Carry``): the register cache does when that
    needs no more register arrays than caching the loads alone."""
    return cache == "regs" and carry_plan(kern).arrays <= max(1, len(cached_loads(kern)))


def smem_bytes(kern: Kernel, rpb: int, vec: int) -> int:
    total = 0
    for n in cached_loads(kern):
        node = kern.nodes[n]
        if vec_ok(node.attr[1], vec):
            total += -(-rpb * kern.cols * ITEMSIZE[node.dtype] // 16) * 16
    return total

