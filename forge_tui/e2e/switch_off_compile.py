"""The switch-off under torch.compile: every kernel the compiled forward served goes off for
compiled models unless the compiled forward is faster with them, confirmed in a process of its own."""

from __future__ import annotations

from typing import Any, Callable

from ..promotion import commit_manifest, kernels
from ..runtime.manifest import Manifest
from ..timing import Stats, paired_ratio
from .switch_off import not_faster


def switch_off_under_compile(ws: Any, man: Manifest, compiled_applied: Any, stats: dict[str, Any],
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
    disable_under_compile(ws, man, served, why)
    return {f"{card} (under torch.compile)": why for card in served}, fresh


def disable_under_compile(ws: Any, man: Manifest, cards: list[str], why: str) -> None:
    """Switch ``cards`` off for compiled models (eager models keep them), with ``why``, in one
    commit of the workspace."""
    for card in cards:
        man.entries[card].compile_disabled_reason = why
    commit_manifest(ws, man, "switch-off", f"switch off {kernels(len(cards))} under torch.compile",
                    [f"{card}: {why}" for card in cards], cards)
