"""Merge cards: sibling linears on one input in one batched product (``merge.py``). The cards are
made by ``forge merge`` (``forge_tui/rewrites/merge.py``)."""

from __future__ import annotations

from ..install import Install
from ..manifest import Entry
from ..merge import install as install_merges
from ..mode import Mode
from ..placement import merges_sparing_scopes


def why_not(entry: Entry, inst: Install) -> str | None:
    if inst.mode == Mode.TORCH_COMPILE:
        return "merged linears are not served in torch.compile'd models (a graph break at each call)"
    return None


def install(inst: Install, entries: list[Entry]) -> None:
    # after the op and chain cards' scopes are known, before they are placed: a merge that would
    # keep a scope from compiling is skipped
    if entries and inst.scopes and inst.compiled_scopes:
        entries = merges_sparing_scopes(inst.applied, inst.model, entries, inst.scopes)
    if entries:
        install_merges(inst.applied, inst.model, entries, inst.device, inst.shadow)
