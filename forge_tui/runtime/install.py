"""One ``apply``'s installation in progress, as every card kind's installer sees it (``kinds/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .applied import Applied
from .chain import ChainGuard
from .graph.backend import compile_worthy
from .guard import Guard, load_consts
from .kernel import KernelUnavailable
from .manifest import Entry
from .mode import Mode
from .opmatch import OpGuard

if TYPE_CHECKING:
    import torch


class Kind(Protocol):
    """A card kind's installer (a module of ``kinds/``)."""

    def why_not(self, entry: Entry, inst: "Install") -> str | None:
        """Why a card of the kind is not served in ``inst``'s mode, before anything is loaded;
        None where it may be."""

    def install(self, inst: "Install", entries: list[Entry]) -> None:
        """Serve the kind's cards ``entries`` in ``inst.model`` (or say in ``inst.applied.skipped``
        why not)."""


@dataclass
class Install:
    """Where and how ``apply`` installs (the model, the manifest's folder, the device, the mode
    and its options), what it installed so far (``applied``), and the scopes of op and chain cards
    that ``placement.place`` serves once every kind has installed."""

    applied: Applied
    model: "torch.nn.Module"
    folder: Path
    device: str
    mode: Mode
    shadow_every: int
    only_faster: bool
    trial_calls: int
    compiled_scopes: bool
    scopes: dict[str, tuple[Any, list[OpGuard | ChainGuard]]] = field(default_factory=dict)
    """Scope path -> (its module, the op and chain guards it serves)."""

    @property
    def shadow(self) -> int:
        """Served calls between shadow checks: none in CUDA graphs (a check synchronises, which a
        capture forbids)."""
        return 0 if self.mode == Mode.CUDA_GRAPH else self.shadow_every

    def skip(self, card: str, why: str) -> None:
        self.applied.skipped[card] = why

    def module_at(self, path: str) -> Any:
        """The model's module at ``path`` ("" for the model), or None where it has none (a card
        profiled on another, deeper, model)."""
        try:
            return self.model.get_submodule(path) if path else self.model
        except AttributeError:
            return None

    def new_guard(self, entry: Entry) -> Guard | None:
        """A guard for an op, module or chain card; None, with the card skipped and why, where its
        kernel cannot be loaded. No dispatch rule outside the op-by-op forward: in a CUDA graph
        the host's cost of a call is paid once, at capture; in a compiled graph the kernel
        replaces the compiler's code, not eager's, and a kernel switched off there falls back to
        the card's program op by op until the model recompiles (the bench's switch-off judges
        them instead)."""
        try:
            return Guard(entry, self.folder, self.device, self.applied.board, self.shadow,
                         load_consts(self.folder, entry, self.device), self.only_faster and self.mode == Mode.INFERENCE)
        except KernelUnavailable as exc:
            self.skip(entry.card, str(exc))
            return None

    def serve_in_compiled_graphs(self, guard: Guard) -> None:
        """An op or chain card in torch_compile mode: served in the graphs ``Applied.backend()``
        compiles (``graph/backend.py``)."""
        self.applied.compile_guards.append(guard)
        self.applied.guards[guard.entry.card] = guard
        guard.status.sites.append("in graphs compiled with Applied.backend()")

    def add_to_scopes(self, guard: Guard, served: OpGuard | ChainGuard, what: str) -> None:
        """An op or chain card's guard in each scope the card names (``placement.place`` serves
        them), or the card skipped where none of its modules is in the model. ``what``: how its
        status names a site ("ops", "a chain")."""
        sig = guard.sig
        for path in sig.module_paths or [""]:
            module = self.module_at(path)
            if module is None:
                continue
            self.scopes.setdefault(path, (module, []))[1].append(served)
            guard.status.sites.append(f"{what} under {path or 'the model'}")
        if guard.status.sites:
            self.applied.guards[sig.card] = guard
        else:
            self.skip(sig.card, "none of its modules is in this model: " + ", ".join(sig.module_paths[:3]))


def compiled_graph_why_not(entry: Entry) -> str | None:
    """Why an op or chain card is not served in a torch.compile'd graph (``Mode.TORCH_COMPILE``),
    or None."""
    sig = entry.signature
    why = compile_worthy(sig.program)
    if why is None and (len(sig.outputs) != 1 or any(s.role == "const" for s in sig.inputs)):
        why = "a card with more than one output or a constant input is not found in a compiled graph"
    return None if why is None else f"not served under torch.compile: {why}"
