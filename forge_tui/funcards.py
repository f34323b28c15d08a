"""A card from a reference function: what ``forge new`` and ``forge_tui.generate`` share.

The function is wrapped in a leaf ``nn.Module`` whose class asks the profiler for a card of its own
(``forge_card = True``, see ``profiler/capture.py``), named after the operation; the workload's
model is that module alone and its inputs are the function's example inputs. Profiling it gives a
module card whose program is the function's aten program, inputs in call order and exactly the
outputs it returns. When that program is one aten op whose op card is the same computation (the
same node, inputs and outputs), the op card is taken instead: it is the same card under the name
the template library knows (softmax, layer norm ...).

The workspace then holds that one card (the op cards of the function's inner ops are not what was
asked for and are left out):

* a new workspace: the profile's usual files, ``workload.py`` the workload that wraps the function
  (``extra`` files beside it, for ``forge new``: ``reference.py`` and the conversation in ``draft/``);
* an existing workspace (same device): the card is added to its cards in one commit on ``main``,
  with its workload and files under ``references/<card id>/``; a card it already has (same id: the
  same program, shapes, dtypes and strides) is reused as it is, with its search and its kernel.

Nothing is written until the profile has succeeded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from .cards import Card, CardKind, save_cards
from .errors import ForgeError, WorkspaceError
from .gitrepo import GitRepo
from .workspace import Workspace, check_target, commit_profile, staging_dir

if TYPE_CHECKING:
    from .workload import Workload

REFERENCES_DIR = "references"
"""Where a card added to an existing workspace keeps its workload and files."""
_STOP = {"for", "with", "on", "in", "at", "of", "over", "using", "to", "a", "an", "the"}


def class_name(text: str, default: str = "Reference") -> str:
    """A Python class name for an operation from its description or a function's name:
    "fused LayerNorm + GELU for (8192, 4096) bf16" gives FusedLayerNormGELU, "layer_norm_gelu"
    LayerNormGelu. The words before the first number or bracket, without trailing "for", "with"...;
    each word's first letter upper-cased, the rest kept."""
    head = re.split(r"[\d(\[{]", text, maxsplit=1)[0]
    words = [w for w in re.split(r"[^A-Za-z0-9]+", head) if w]
    while words and words[-1].lower() in _STOP:
        words.pop()
    name = "".join(w[0].upper() + w[1:] for w in words)[:48]
    return name if name.isidentifier() and not name[0].isdigit() else default


def slug(text: str, default: str = "op") -> str:
    """A folder name for an operation: lower case, words joined by "_", at most 48 characters."""
    words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+", text) if w]
    out = "_".join(words)[:48].strip("_")
    return out or default


def snake(name: str) -> str:
    """LayerNormGelu -> layer_norm_gelu (a workload's name)."""
    return slug(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name))


# ---- the wrapper -------------------------------------------------------------------------------
def reference_module(fn: Callable[..., Any], name: str) -> Any:
    """``fn`` as a leaf module of class ``name`` that the profiler makes one card. ``fn`` is kept
    outside the module tree (an nn.Module passed as the function stays hidden: the wrapper is the
    leaf, its parameters are the card's constants)."""
    import torch

    def __init__(self: Any) -> None:
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_forge_fn", fn)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._forge_fn(*args, **kwargs)

    cls = type(name, (torch.nn.Module,), {"forge_card": True, "__init__": __init__, "forward": forward,
                                          "__module__": __name__, "__qualname__": name})
    # in inference mode, as the profile calls it: the runtime serves a module card only while the
    # module's attributes, its training flag among them, are those the profile recorded
    return cls().eval()


def function_workload(fn: Callable[..., Any], inputs: Sequence[Any], name: str, path: Path) -> "Workload":
    """An in-memory workload: the model is ``fn`` wrapped (``reference_module``), its inputs
    ``inputs``; ``path`` is the file that stands for it in the workspace (it must exist)."""
    from .workload import Workload

    mod = types.ModuleType(f"forge_function_{name}")
    mod.get_model = lambda: reference_module(fn, name)  # type: ignore[attr-defined]
    mod.get_inputs = lambda: list(inputs)  # type: ignore[attr-defined]
    return Workload(path=Path(path).resolve(), name=snake(name), format="forge", module=mod,
                    source_sha=hashlib.sha256(Path(path).read_bytes()).hexdigest(), default_dtype=None)


def function_stub(fn: Callable[..., Any], name: str) -> str:
    """The ``workload.py`` of a workspace made from an in-process function: where it came from and
    its source where Python can read it (it cannot rebuild the model: the function and its inputs
    were handed over in memory)."""
    import inspect

    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = "(its source could not be read)\n"
    body = "".join(f"#     {line}" if line.strip() else "#\n" for line in source.splitlines(keepends=True))
    return (f'"""forge_tui.generate profiled the Python function {where} in process, wrapped in the leaf module\n'
            f"{name}: this workspace's card is that function. This file records where the card came from; it\n"
            'cannot rebuild the model (the function and its example inputs were handed over in memory)."""\n\n'
            f"# The function's source, as Python could read it:\n#\n{body}\n\n"
            "def get_model():\n"
            f"    raise RuntimeError({'this workspace was made from ' + where + ' in process: call forge_tui.generate again'!r})\n\n\n"
            "def get_inputs():\n"
            "    return get_model()\n")


# ---- the card ----------------------------------------------------------------------------------
def _same_computation(op: Card, mod: Card) -> bool:
    """The op card is the one-op module card's computation: the same node on the same inputs, and
    the module returns its outputs or some of them, dropping only what the profiler would not make
    a module card for (a norm's saved mean and rstd: F.layer_norm returns native_layer_norm's first
    output). The runtime serves the op inside the function, so the function gets what it returns."""
    from .profiler.capture import _drops_outputs

    nodes = mod.program["nodes"]
    if op.kind != CardKind.OP or len(nodes) != 1:
        return False
    a, b = op.program["nodes"][0], nodes[0]
    if (a["op"], a["args"], a.get("kwargs", {})) != (b["op"], b["args"], b.get("kwargs", {})):
        return False
    outs = mod.program["outputs"]
    if not all(r in op.program["outputs"] for r in outs) or _drops_outputs(nodes, outs):
        return False

    def key(specs: list[Any]) -> list[tuple[Any, ...]]:
        return [(s.shape, s.stride, s.dtype) for s in specs]

    return key(op.inputs) == key(mod.inputs)


def function_card(cards: list[Card], name: str) -> Card:
    """The card of the wrapped function among a profile's cards (see the module's docstring); a
    ForgeError saying why when the profile made none."""
    target = f"module:{name}"
    mods = [c for c in cards if c.kind == CardKind.MODULE and c.target == target]
    if not mods:
        raise ForgeError(f"profiling the reference made no card for {name}: it must compute something on its "
                         "tensor inputs (not only views or copies), without random numbers, with arguments that "
                         "have a JSON form, and return a tensor or a tuple of tensors")
    card = mods[0]
    op = next((c for c in cards if _same_computation(c, card)), None)
    return op if op is not None else card


# ---- into a workspace ---------------------------------------------------------------------------
@dataclass
class CardWorkspace:
    workspace: Workspace
    card: Card
    how: Literal["new", "added", "existing"]
    """A new workspace, the card added to an existing one, or a card the workspace already had."""


def profile_to_card(workload: "Workload", target: Path, name: str, *, device: str | None = None,
                    config_path: Path | None = None,
                    files: Callable[[Card, str], dict[str, bytes]] = lambda card, where: {},
                    reuse: bool = True,
                    progress: Callable[[str], None] = lambda msg: None,
                    profile: Callable[..., Any] | None = None) -> CardWorkspace:
    """Profile ``workload`` (its model the wrapper of class ``name``) and put the function's card
    into ``target``: a new workspace, or an existing one (``reuse``). ``files(card, folder)`` gives
    the extra files to commit with it, by path relative to ``folder`` (the workspace root for a new
    workspace, ``references/<card id>`` for an added card). ``profile`` replaces
    ``profile_workload`` (same arguments and result: forge new profiles in a confined process).
    Raises ForgeError having written nothing."""
    from .config import discover_config
    from .profiler.run import profile_workload
    from .tensorstore import TensorStore
    from .workload import resolve_device

    target = Path(target)
    kind = check_target(target)
    if kind == "ours" and not reuse:
        raise WorkspaceError(f"{target} is already a workspace: choose another path (-w) for a new one")
    cfg, _ = discover_config(config_path, target if kind == "ours" else None)
    dev = resolve_device(device)
    ws = Workspace(target) if kind == "ours" else None
    if ws is not None and ws.meta.get("device") not in (None, dev):
        raise WorkspaceError(f"{target} was profiled on {ws.meta.get('device')}: its cards cannot take one profiled "
                             f"on {dev} (choose another workspace, or --device {ws.meta.get('device')})")
    staging = staging_dir(target)
    try:
        store = TensorStore(staging / ".forge" / "cache" / "tensors")
        result = (profile or profile_workload)(workload, dev, None, cfg, store, progress)
        card = function_card(result.cards, name)
        if ws is not None:
            have = {c.id: c for c in ws.cards()}
            if card.id in have:
                return CardWorkspace(ws, have[card.id], "existing")
        _keep_only(store, card)
        result.cards = [card]
        if ws is None:
            _write_files(staging, files(card, ""))
            progress(f"writing workspace {target}")
            return CardWorkspace(commit_profile(target, staging, result, workload, cfg), card, "new")
        progress(f"adding card {card.id} to {target}")
        _add_card(ws, store, card, workload, files(card, f"{REFERENCES_DIR}/{card.id}"))
        return CardWorkspace(ws, card, "added")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _keys(card: Card) -> set[str]:
    return {k for s in card.samples for k in (*s.inputs, *s.outputs)}


def _keep_only(store: Any, card: Card) -> None:
    """Drop the captured tensors of the cards left out (the inner ops')."""
    keep = _keys(card)
    if store.root.is_dir():
        for f in store.root.rglob("*.pt"):
            if f.stem not in keep:
                f.unlink()


def _write_files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts:
            raise ValueError(f"not a relative path inside the workspace: {rel}")
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _add_card(ws: Workspace, store: Any, card: Card, workload: "Workload", files: dict[str, bytes]) -> None:
    folder = f"{REFERENCES_DIR}/{card.id}"
    for key in _keys(card):
        src = store.path(key)
        if src.is_file():
            dest = ws.store.path(key)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
    written = {f"{folder}/workload.py": Path(workload.path).read_bytes(), **{f"{folder}/{k}": v for k, v in files.items()}}
    _write_files(ws.root, written)
    save_cards([card], ws.cards_dir)
    with GitRepo.open(ws.root) as repo:
        repo.commit_worktree(f"add card {card.id}", f"{card.label}, from {workload.name} (see {folder}/)",
                             {"Forge-Event": "add-card", "Forge-Cards": card.id})
