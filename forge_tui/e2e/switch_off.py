"""The switch-off in eager models: units of served kernels left out in turn, each switched off
where the forward runs faster without it, then the kernels left against eager."""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..cards import CardKind
from ..promotion import commit_manifest, kernels
from ..rewrites import REWRITES
from ..runtime.apply import apply
from ..runtime.manifest import Manifest
from ..timing import Stats, Timer, paired_ratio
from .memory import GcPauses, free_memory


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
        free_memory()  # the copies' memory back before the next unit's
    return w, wo


def switch_off_slower(wl: Any, model: Any, inputs: Any, ws: Any, man: Manifest, applied: Any, dev: str,
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
