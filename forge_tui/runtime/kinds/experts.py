"""Experts cards: a routed mixture-of-experts block in one grouped pass (``experts.py``). The cards
are made by ``forge experts`` (``forge_tui/rewrites/experts.py``)."""

from __future__ import annotations

from ..experts import install as install_experts
from ..install import Install
from ..manifest import Entry
from ..mode import Mode


def why_not(entry: Entry, inst: Install) -> str | None:
    return None


def install(inst: Install, entries: list[Entry]) -> None:
    if entries:
        install_experts(inst.applied, inst.model, entries, inst.device, inst.shadow,
                        compiled=inst.mode == Mode.TORCH_COMPILE)
