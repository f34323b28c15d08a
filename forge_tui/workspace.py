"""A workspace: one git repository per project, created by ``forge profile``.

Layout of ``main``::

    workspace.json     marker and metadata (format, workload, device, dtype)
    forge.toml         the configuration the profile ran with
    workload.py        a copy of the workload file (the workspace is self-contained)
    cards/<id>.json    operator cards
    optable.txt/.json  the op table
    profile.json       forward time, device ceilings, coverage, skipped calls
    .forge/cache/      captured tensors and built libraries, keyed by hash (git-ignored)

Creating or re-profiling writes nothing visible until the profile has finished: a new workspace
is assembled in a sibling staging folder and renamed into place; an existing one gets its new
files only after the profile succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from . import __version__
from .cards import Card, id_matches, load_cards, save_cards
from .config import CONFIG_NAME, ForgeConfig, to_toml
from .errors import ForgeError, WorkspaceError
from .gitrepo import GitRepo
from .table import render, rows
from .tensorstore import TensorStore

MARKER = "workspace.json"
FORMAT = 1
GITIGNORE = ".forge/\n__pycache__/\n"


def is_workspace(path: Path) -> bool:
    marker = path / MARKER
    if not (marker.is_file() and (path / ".git").exists()):
        return False
    try:
        return json.loads(marker.read_text()).get("tool") == "forge-tui"
    except (OSError, ValueError):
        return False


def check_target(path: Path) -> str:
    """'new' (absent or empty folder) or 'ours'; anything else is an error naming the cause."""
    if not path.exists():
        return "new"
    if not path.is_dir():
        raise WorkspaceError(f"workspace path {path} exists and is a file, not a forge workspace")
    if is_workspace(path):
        return "ours"
    if not any(path.iterdir()):
        return "new"
    raise WorkspaceError(f"workspace path {path} exists and is not a forge workspace (no {MARKER}); "
                         "choose another path or an empty folder")


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    @classmethod
    def open(cls, path: Path) -> "Workspace":
        path = Path(path)
        if not path.exists():
            raise WorkspaceError(f"no workspace at {path} (create one with: forge profile WORKLOAD -w {path})")
        if not is_workspace(path):
            raise WorkspaceError(f"{path} is not a forge workspace (no {MARKER})")
        return cls(path)

    @property
    def meta(self) -> dict:
        return json.loads((self.root / MARKER).read_text())

    @property
    def cache(self) -> Path:
        return self.root / ".forge" / "cache"

    @property
    def store(self) -> TensorStore:
        return TensorStore(self.cache / "tensors")

    @property
    def cards_dir(self) -> Path:
        return self.root / "cards"

    def cards(self) -> list[Card]:
        return _covered(load_cards(self.cards_dir))

    def card(self, card_id: str) -> Card:
        path = self.cards_dir / f"{card_id}.json"
        if not path.is_file():
            matches = [p for p in self.cards_dir.glob("*.json") if id_matches(p.stem, card_id)]
            if len(matches) != 1:
                raise WorkspaceError(f"no card '{card_id}' in {self.root}" if not matches else
                                     f"card '{card_id}' is ambiguous in {self.root}: {len(matches)} match")
            path = matches[0]
        return _covered([Card.model_validate_json(path.read_text())])[0]

    def profile_summary(self) -> dict:
        p = self.root / "profile.json"
        return json.loads(p.read_text()) if p.exists() else {}

    @contextmanager
    def git(self) -> Iterator[GitRepo]:
        with GitRepo.open(self.root) as repo:
            yield repo


def _covered(cards: list[Card]) -> list[Card]:
    """The cards, each with which proposer covers it: cards saved before the fact was stored get it
    worked out here, in memory (the workspace's files are not changed), so that the op table, the
    card pane and the share served offline read it the same for every workspace."""
    if all(c.coverage is not None for c in cards):
        return cards
    from .templates.coverage import cover

    return cover(cards)


def _write_profile_files(root: Path, result, workload, cfg: ForgeConfig) -> None:
    if (root / "cards").exists():
        shutil.rmtree(root / "cards")
    save_cards(result.cards, root / "cards")
    meta = {
        "tool": "forge-tui", "format": FORMAT, "version": __version__,
        "workload": {"name": workload.name, "path": str(workload.path), "format": workload.format,
                     "sha256": workload.source_sha},
        "device": result.device, "device_name": result.device_name, "dtype": result.dtype,
        "profiled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (root / MARKER).write_text(json.dumps(meta, indent=1) + "\n")
    (root / CONFIG_NAME).write_text(to_toml(cfg))
    shutil.copyfile(workload.path, root / "workload.py")
    (root / "profile.json").write_text(json.dumps(result.summary(), indent=1) + "\n")
    title = f"{workload.name} on {result.device_name}: forward {result.forward.median:.1f} µs"
    (root / "optable.txt").write_text(render(result.cards, title=title))
    (root / "optable.json").write_text(json.dumps(rows(result.cards), indent=1) + "\n")
    (root / ".gitignore").write_text(GITIGNORE)


def staging_dir(target: Path) -> Path:
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent / f".{target.name}.forge-staging-{os.getpid()}"


def commit_profile(target: Path, staging: Path, result, workload, cfg: ForgeConfig) -> Workspace:
    """Move a finished profile (tensors already in ``staging``'s store) into the workspace and commit."""
    target = Path(target).absolute()
    kind = check_target(target)
    subject = f"profile {workload.name}: {len(result.cards)} cards on {result.device_name}"
    trailers = {"Forge-Event": "profile", "Forge-Cards": len(result.cards), "Forge-Device": result.device}
    if kind == "new":
        _write_profile_files(staging, result, workload, cfg)
        with GitRepo.init(staging) as repo:
            repo.commit_worktree(subject, trailers=trailers)
        if target.exists():
            target.rmdir()  # empty folder
        os.replace(staging, target)
        return Workspace(target)
    ws = Workspace(target)
    src = staging / ".forge" / "cache" / "tensors"
    if src.exists():
        for f in src.rglob("*.pt"):
            dest = ws.store.path(f.stem)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
    _write_profile_files(target, result, workload, cfg)
    with ws.git() as repo:
        repo.commit_worktree(subject, trailers=trailers)
    shutil.rmtree(staging, ignore_errors=True)
    return ws


def profile_into_workspace(workload_spec, workspace_path, *, device: str | None = None, dtype: str | None = None,
                           config_path=None, progress: Callable[[str], None] = lambda msg: None,
                           generate: int | None = None):
    """The whole ``forge profile`` job: validate everything first, profile, then write atomically.
    ``generate``: profile a generation of that many new tokens (``profiler.generation``).

    Returns (Workspace, ProfileResult). Raises ForgeError subclasses for bad input, having written
    nothing.
    """
    import shutil
    from pathlib import Path

    from .config import discover_config
    from .profiler.run import profile_workload
    from .tensorstore import TensorStore
    from .workload import load_workload, parse_dtype, resolve_device

    target = Path(workspace_path)
    kind = check_target(target)
    cfg, _ = discover_config(Path(config_path) if config_path else None, target if kind == "ours" else None)
    torch_dtype = parse_dtype(dtype)
    dev = resolve_device(device)
    workload = load_workload(workload_spec)
    if generate is not None and generate < 2:
        raise ForgeError(f"--generate needs at least 2 new tokens (a prefill and a decode step), got {generate}")
    staging = staging_dir(target)
    try:
        store = TensorStore(staging / ".forge" / "cache" / "tensors")
        result = profile_workload(workload, dev, torch_dtype, cfg, store, progress, generate=generate)
        progress(f"writing workspace {target}")
        ws = commit_profile(target, staging, result, workload, cfg)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return ws, result


def retime_cards(ws: Workspace, *, progress: Callable[[str], None] = lambda line: None,
                 stop: Callable[[], bool] = lambda: False):
    """The workspace's cards whose profiled time is not trusted, timed again if the machine is
    quiet now (``profiler.retime``); what changed is written to ``main`` (cards, op table,
    profile) in one commit. Returns the ``CardRetime``."""
    from .config import discover_config
    from .profiler.retime import retime

    cfg, _ = discover_config(None, ws.root)
    meta = ws.meta
    spec = str(ws.root / "workload.py") if (ws.root / "workload.py").is_file() else meta["workload"]["path"]
    cards, summary = ws.cards(), ws.profile_summary()
    outcome = retime(cards, summary, device=meta.get("device") or "cpu", cfg=cfg, store=ws.store, workload=spec,
                     dtype=meta.get("dtype"), progress=progress, stop=stop)
    if outcome.changed:
        root = ws.root
        save_cards(cards, root / "cards")
        (root / "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
        forward = float((summary.get("forward_us") or {}).get("median") or 0.0)
        title = f"{meta['workload']['name']} on {meta.get('device_name', '?')}: forward {forward:.1f} µs"
        (root / "optable.txt").write_text(render(cards, title=title))
        (root / "optable.json").write_text(json.dumps(rows(cards), indent=1) + "\n")
        with ws.git() as repo:
            repo.commit_worktree(f"time {len(outcome.retimed)} card(s) again on a quiet machine",
                                 trailers={"Forge-Event": "retime-cards", "Forge-Cards": len(outcome.retimed)})
    return outcome
