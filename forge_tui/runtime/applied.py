"""What ``apply`` installed in one model: its guards, its replaced forwards, and undo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .custom_op import custom_op
from .experts import ExpertsGuard
from .fold import FoldGuard
from .forwards import ReplacedForwards
from .graph.backend import CompileBackend
from .graph.scope import GraphScope
from .guard import Guard
from .leaf import LeafSites
from .merge import MergeGuard
from .mode import Mode
from .passthrough import Passthrough
from .status import StatusBoard
from .trace import TraceSinks

if TYPE_CHECKING:
    import torch


TAKEN_OUT = "off for good, the module's own forward given back"


class Applied:
    """What ``apply`` installed; undo() (or leaving the ``with`` block) removes it all."""

    def __init__(self, model: "torch.nn.Module", board: StatusBoard) -> None:
        self.model = model
        self.board = board
        self.guards: dict[str, Guard] = {}
        self.skipped: dict[str, str] = {}
        self.scopes: dict[str, GraphScope] = {}
        """The scopes served compiled, by module path (``graph/``)."""
        self.forwards = ReplacedForwards()
        self.folds: dict[str, FoldGuard] = {}
        """The fold cards served (``fold.py``), by card."""
        self.experts: dict[str, ExpertsGuard] = {}
        """The experts cards served (``experts.py``), by card."""
        self.merges: dict[str, MergeGuard] = {}
        """The merge cards served (``merge.py``), by card."""
        self.leaves: dict[str, LeafSites] = {}
        """The leaf modules whose op card's call is learned (``LeafSites``), by module path."""
        self._on_undo: list[Callable[[], None]] = []
        self.compile_guards: list[Guard] = []
        """torch_compile mode: the op and chain cards that ``backend()`` serves."""
        self.in_graph: set[int] = set()
        """The forwards (by id) that a compiled scope's graph traces: module cards'
        (``placement.IN_GRAPH``)."""
        self.trace = TraceSinks()
        """Where the fallbacks go that a trace of this model's module cards decides (``trace.py``):
        shared by its module cards' forwards and its compiled scopes."""
        self._backends: dict[str, CompileBackend] = {}
        self.mode = Mode.INFERENCE
        self.passthrough: Passthrough | None = None
        """Runs the model's calls that serve nothing as written (``passthrough.py``); inference mode."""
        self.traced: set[int] = set()
        """The modules (by id) inside a compiled scope, whose forwards Dynamo guarded: never taken
        out (``take_out``), which would make the scope compile again."""
        self.taken_out: list[str] = []
        """The module paths whose forge forward was taken out once every card it served was off."""
        self.take_outs = True
        """Whether ``take_out`` puts forwards back. Off, a switched-off card's calls keep passing
        forge's checks: what the e2e bench's "every kernel falling back" variant times."""

    def take_out(self, module: Any, new: Callable[..., Any]) -> bool:
        """Every card that ``new`` (forge's forward of ``module``) serves is off for good: put back
        the module's own forward, so that its calls no longer pay for forge's checks (a switched-off
        RMSNorm at each step of a generation loop). Only op by op (a model compiled or captured
        after ``apply`` keeps what it traced), outside any compiled scope, and never while one
        traces or a CUDA graph captures. Whether it was put back."""
        if not self.take_outs or self.mode != Mode.INFERENCE or id(module) in self.traced:
            return False
        import torch

        if torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return False
        if not self.forwards.take_out(module, new):
            return False
        path = next((n for n, m in self.model.named_modules() if m is module), "?")
        label = path or "the model"
        self.taken_out.append(label)
        for g in self.guards.values():  # the status says where forge's checks no longer run
            g.status.sites = [f"{site}: {TAKEN_OUT}" if site == path or site.endswith(f" under {label}")
                              or site.endswith(f" under {label} (compiled)") else site for site in g.status.sites]
        self.board.write()
        return True

    def backend(self, inner: str = "inductor") -> CompileBackend:
        """The torch.compile backend for this model in torch_compile mode:
        ``torch.compile(model, backend=applied.backend())``. It serves the op and chain cards in
        the compiled graphs (``graph.CompileBackend``) and hands them on to ``inner``; module
        cards are custom ops in any torch.compile'd model. One object per inner backend, so that
        Dynamo's cache tells this model's graphs from those of any other backend."""
        if inner not in self._backends:
            device = next((g.device for g in self.guards.values()), "cpu")
            self._backends[inner] = CompileBackend(self.compile_guards, device, custom_op, inner)
        return self._backends[inner]

    def _replace_forward(self, module: Any, new: Callable[..., Any]) -> None:
        self.forwards.replace(module, new)

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when undone, after the forwards are restored (last registered first)."""
        self._on_undo.append(fn)

    def undo(self) -> None:
        self.forwards.restore()
        while self._on_undo:
            self._on_undo.pop()()
        self.board.close()

    def status(self) -> dict[str, Any]:
        return self.board.snapshot()

    def __enter__(self) -> "Applied":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()
