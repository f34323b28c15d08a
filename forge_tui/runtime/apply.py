"""``apply(model, source)``: the promoted kernels in an unmodified model, behind guards.

    with forge_tui.runtime.apply(model, "workspaces/demo") as applied:
        y = model(x)
        print(applied.status())

Each card kind has its installer in ``kinds/`` (``KINDS``): module cards replace the ``forward``
of the leaf modules they were profiled at (``module_card.py``); op and chain cards are served in
the scopes they were profiled in, compiled where the forward allows it (``graph/``) and else
intercepted (``intercept.py``, ``leaf.py``), as ``placement.py`` decides; fold, experts and merge
cards rewrite the forward of the modules that call them (``fold.py``, ``experts.py``,
``merge.py``: the runtime's halves of the rewrites in ``forge_tui/rewrites/``, which this package
never imports). Nothing is installed for cards not promoted, so a model with nothing promoted runs
exactly as before.

Every call goes through a guard (``guard.py``): the kernel runs only when the call is the card's
(device, dtype, shape, strides, non-tensor arguments, the module's attributes as the profile
recorded them); anything else runs the original PyTorch code. ``Mode.TORCH_COMPILE`` routes module
cards through custom ops (``custom_op.py``), so a compiled model keeps each kernel as one opaque
node and fuses around it; op and chain cards that reduce are served inside the compiled graphs by
``Applied.backend()`` (``torch.compile(model, backend=applied.backend())``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cards import CardKind
from ..errors import ForgeError
from . import placement
from .applied import TAKEN_OUT, Applied
from .forwards import ReplacedForwards, called_children
from .guard import Guard
from .install import Install, Kind
from .intercept import UNSERVED_WHY
from .kinds import chain, experts, fold, merge, module, op
from .manifest import KERNELS_DIR, MANIFEST_NAME, Entry, Manifest
from .mode import Mode
from .module_card import module_inputs
from .opmatch import OpGuard
from .passthrough import Passthrough
from .status import STATUS_FILE, StatusBoard
from .trial import Trial

if TYPE_CHECKING:
    import torch

__all__ = ["KINDS", "TAKEN_OUT", "UNSERVED_WHY", "Applied", "Guard", "Mode", "OpGuard", "ReplacedForwards", "Trial",
           "apply", "called_children", "module_inputs"]

KINDS: dict[CardKind, Kind] = {CardKind.MODULE: module, CardKind.OP: op, CardKind.CHAIN: chain, CardKind.FOLD: fold,
                               CardKind.EXPERTS: experts, CardKind.MERGE: merge}
"""Each card kind's installer (``kinds/``), in the order ``apply`` installs them: module cards
first; op and chain cards add their scopes, which fold cards' forwards run inside, and merge
cards spare (``placement.merges_sparing_scopes``); ``placement.place`` serves the scopes last."""


def apply(model: "torch.nn.Module", source: Any, *, mode: Mode | str = Mode.INFERENCE, device: str | None = None,
          cards: list[str] | None = None, shadow_every: int = 0, only_faster: bool = True,
          trial_calls: int = 6, compiled_scopes: bool = True) -> Applied:
    """Put the promoted kernels of ``source`` (a Workspace, its path, or an export folder) into
    ``model`` for the calls they match. Returns an ``Applied`` handle (a context manager).

    ``only_faster`` (default): a kernel measured slower than eager is not used, one whose
    dispatch (measured on its first calls) costs more than it saves is switched off, and (in
    inference mode, ``trial_calls`` > 0) each card's first calls in this model are timed with the
    kernel and without, ``trial_calls`` of each, and the kernel is switched off unless it was
    faster there (see ``Trial``). ``mode``: ``inference`` (the op-by-op forward), ``torch_compile``
    (for a model compiled after this: module cards as custom ops, and op and chain cards served
    by ``Applied.backend()``), ``cuda_graph`` (for a model captured in a CUDA graph after this:
    see ``Mode.CUDA_GRAPH``). ``compiled_scopes``: serve op and chain cards in a module's forward
    compiled once by torch.compile, their ops replaced (``graph/``: in Dynamo's torch-level
    graph where they map, else in the aten graph), where the forward allows it; else (or False)
    through the interceptor, a Python dispatch mode that every op of the scope passes through."""
    mode = Mode(mode)
    trial_calls = trial_calls if only_faster and mode == Mode.INFERENCE else 0
    folder, status_path = _resolve(source)
    man = Manifest.load(folder)
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device.type if p is not None else "cpu"
    board = StatusBoard(status_path)
    applied = Applied(model, board)
    applied.mode = mode
    inst = Install(applied, model, folder, device, mode, shadow_every, only_faster, trial_calls, compiled_scopes)
    try:  # a failure part way leaves the model as it was
        _install(inst, man, cards)
    except BaseException:
        applied.undo()
        raise
    board.write()
    return applied



def _install(inst: Install, man: Manifest, cards: list[str] | None) -> None:
    """What ``apply`` installs: each card its mode's verdicts and its kind allow, by its kind's
    installer (``KINDS``), then the scopes of op and chain cards (``placement.place``)."""
    by_kind: dict[CardKind, list[Entry]] = {kind: [] for kind in KINDS}
    for card_id, entry in sorted(man.entries.items()):
        if cards and card_id not in cards:
            continue
        kind = KINDS[entry.signature.kind]
        why = _mode_why_not(entry, inst.mode, inst.only_faster) or kind.why_not(entry, inst)
        if why:
            inst.skip(card_id, why)
        else:
            by_kind[entry.signature.kind].append(entry)
    for name, kind in KINDS.items():
        kind.install(inst, by_kind[name])
    placement.place(inst)
    applied, model = inst.applied, inst.model
    if inst.mode == Mode.INFERENCE and applied.forwards.modules() and model not in applied.forwards.modules():
        # a model's calls that its cards serve nothing in (a generation's decode steps) stop
        # paying for forge's forwards (``passthrough.py``)
        applied.passthrough = Passthrough(model, applied.board, applied.forwards.suspend, applied.forwards.resume)
        applied.forwards.replace(model, applied.passthrough.call)


def _mode_why_not(entry: Entry, mode: Mode, only_faster: bool) -> str | None:
    """Why the card is off in this mode, by its evaluation and the bench's verdicts, or None.
    Each mode by its own verdict: the op-by-op one (``enabled``) weighs the host's cost of each
    call, which a graph pays once and a compiled forward far less."""
    if mode == Mode.CUDA_GRAPH:
        if entry.graph_disabled_reason:
            return f"switched off in CUDA graphs: {entry.graph_disabled_reason}"
    elif mode == Mode.INFERENCE and not entry.enabled:
        return f"switched off: {entry.disabled_reason}"
    gain = entry.evidence.speedup_vs_eager
    if only_faster and gain is not None and gain <= 1.0:
        return f"measured slower than eager ({gain:.3f}x)"
    if mode == Mode.TORCH_COMPILE and entry.compile_disabled_reason:
        return f"switched off under torch.compile: {entry.compile_disabled_reason}"
    vs_compile = entry.evidence.speedup_vs_compile
    if only_faster and mode == Mode.TORCH_COMPILE and vs_compile is not None and vs_compile <= 1.0:
        # torch.compile would fuse the card better than the kernel does
        basis = ", its kernels' device time" if entry.evidence.compile_basis == "device" else ""
        return f"measured slower than torch.compile's own code for the card ({vs_compile:.3f}x{basis})"
    return None


def _resolve(source: Any) -> tuple[Path, Path | None]:
    """(the folder holding manifest.json, the status file's path) for a workspace, its path, or
    an export."""
    # a path (str or os.PathLike), else a Workspace (its root)
    root = Path(source) if isinstance(source, (str, os.PathLike)) else Path(source.root)
    if (root / KERNELS_DIR / MANIFEST_NAME).is_file():
        return root / KERNELS_DIR, root / STATUS_FILE
    if (root / MANIFEST_NAME).is_file():
        from .export import verify

        verify(root)
        return root, root / "status.json"
    raise ForgeError(f"{root} has no promoted kernels (no {KERNELS_DIR}/{MANIFEST_NAME}; approve some with forge approve)")

