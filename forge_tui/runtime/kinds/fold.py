"""Fold cards: a batch norm folded into the convolution before it (``fold.py``), served in the
forward of the module that calls the pair, op by op and in CUDA graphs. The cards are made by
``forge fold`` (``forge_tui/rewrites/fold.py``)."""

from __future__ import annotations

from ..fold import install as install_folds
from ..install import Install
from ..manifest import Entry
from ..mode import Mode


def why_not(entry: Entry, inst: Install) -> str | None:
    if inst.mode == Mode.TORCH_COMPILE:
        return "folds are not served in torch.compile'd models"
    return None


def install(inst: Install, entries: list[Entry]) -> None:
    # before the scopes are placed: a scope's forward is then the folded one, intercepted
    if entries:
        install_folds(inst.applied, inst.model, entries, inst.device, inst.shadow_every, inst.mode == Mode.CUDA_GRAPH)
