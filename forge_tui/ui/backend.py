"""What the app asks of a workspace, in one place: every call reaches the core's own API (the
workspace, the search's git store, promotion, the runtime's status, ``forge bench``). The screens
call these from Textual workers (they read git, build kernels, run models), never on the UI thread.

Tests hand the app a subclass with fixed answers (snapshots must not depend on measured times).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..kernel_abi import SOURCE_NAMES as CANDIDATE_NAMES

if TYPE_CHECKING:
    from ..cards import Card
    from ..evaluator.result import EvalResult
    from ..promotion import Request
    from ..runtime.manifest import Entry
    from ..search.events import EventBus, SearchEvent
    from ..search.runner import Search

VIEWABLE_SOURCES = (*CANDIDATE_NAMES.values(), "reference.py")
"""The node's files the app shows as its source, in this order of preference."""


@dataclass
class NodeDetail:
    """Everything the search screen's panes show for one node."""

    card: str
    node: str
    parent: str | None = None
    source: str = ""
    language: str = "cuda"
    """cuda (also for the cpu backend's C++), or python (the root's eager reference)."""
    diff: str = ""
    result: "EvalResult | None" = None
    transcript: list[dict[str, Any]] | None = None
    missing: str = ""
    """Why nothing could be read (a damaged branch), when that is so."""


@dataclass
class BenchOutcome:
    table: str
    speedup: float | None
    outputs_agree: dict[str, str | None] = field(default_factory=dict)
    switched_off: dict[str, str] = field(default_factory=dict)
    """Kernels switched off because the whole forward ran faster without them."""


@dataclass
class RewriteOutcome:
    """What ``forge fold`` and ``forge experts`` did to the workspace's model, line by line."""

    lines: list[str]
    promoted: int
    """Fold and experts cards promoted by this run."""


def language_of(name: str) -> str:
    return "python" if name.endswith(".py") else "cuda"


class Backend:
    """A workspace, as the app sees it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- the workspace -------------------------------------------------------------------------
    def _ws(self) -> Any:
        from ..workspace import Workspace

        return Workspace.open(self.root)

    def title(self) -> str:
        meta = self._ws().meta
        return f"{meta['workload']['name']} on {meta.get('device_name', '?')}"

    def cards(self) -> list["Card"]:
        cards: list[Card] = self._ws().cards()
        return cards

    # ---- the search, from git ------------------------------------------------------------------
    def events(self) -> list["SearchEvent"]:
        """Every recorded event, in the order the search grew (``forge replay``)."""
        from ..search.replay import load_replay

        events, _ = load_replay(self._ws())
        return events

    def node_detail(self, card: str, node: str) -> NodeDetail:
        """A node's source, its diff against its parent, its evaluation and the agent's transcript."""
        from ..evaluator.result import load_result
        from ..search.store import FOLDER, SearchStore, node_ref

        out = NodeDetail(card, node)
        with self._ws().git() as repo:
            commit = repo.read_ref(node_ref(card, node))
            if commit is None:
                out.missing = f"no branch search/{card}/{node}"
                return out
            store = SearchStore(repo)
            meta = store.read(commit, "node.json")
            if meta:
                try:
                    out.parent = json.loads(meta).get("parent")
                except ValueError:
                    pass
            name = ""
            for name in VIEWABLE_SOURCES:
                raw = store.read(commit, name)
                if raw is not None:
                    out.source, out.language = raw.decode(errors="replace"), language_of(name)
                    break
            out.result = load_result(store.read(commit, "result.json"))
            tr = store.read(commit, "transcript.json")
            if tr:
                try:
                    data = json.loads(tr)
                    out.transcript = data if isinstance(data, list) else [data]
                except ValueError:
                    out.transcript = [{"type": "note", "text": "transcript.json is not readable JSON"}]
            if out.parent and name:
                parent = repo.read_ref(node_ref(card, out.parent))
                if parent is not None:
                    try:
                        out.diff = repo.git("diff", "--no-color", parent, commit, "--", FOLDER)
                    except Exception as exc:  # noqa: BLE001 - a diff that git cannot make is shown as such
                        out.diff = f"(no diff: {exc})"
        return out

    @contextmanager
    def search(self, *, settings: dict[str, Any], cards: list[str] | None, bus: "EventBus", proposer: str = "auto",
               config: Path | None = None) -> Iterator[tuple["Search", bool, str]]:
        """A search on the workspace (the session's proposer and the backend it was profiled on),
        resumed when one is recorded: (the search, whether it resumes, which proposer and why)."""
        from ..session import Session

        session = Session.open(self.root, config).with_search_settings(**settings)
        with session.search(proposer=proposer, backend=session.profiled_backend(), cards=cards, bus=bus) as search:
            # resume=True: run() continues whatever is recorded (damaged records too, never started
            # over) and starts fresh where nothing is
            yield search, True, session.notes[-1]

    def retime(self, config: Path | None = None) -> list[str]:
        """``forge retime``: the kernels a busy machine left untimed, evaluated again; a line each."""
        from ..session import Session

        session = Session.open(self.root, config)
        with session.search(proposer="templates", backend=session.profiled_backend()) as search:
            search.retime()
        return search.retime_lines()

    def profile(self, workload: str, *, device: str | None, dtype: str | None, config: Path | None,
                progress: Callable[[str], None]) -> None:
        from ..session import Session

        Session.profile(workload, self.root, device=device, dtype=dtype, config=config, progress=progress)

    # ---- promotion -----------------------------------------------------------------------------
    def requests(self) -> list["Request"]:
        """The pending promotion requests, best first; a card's request is left out while the
        kernel promoted for it is at least as fast (the core lists its next-best node)."""
        from ..promotion import manifest, requests

        ws = self._ws()
        promoted = manifest(ws).entries
        out = [r for r in requests(ws) if r.card.id not in promoted
               or r.speedup > (promoted[r.card.id].evidence.speedup_vs_eager or 0.0)]
        return sorted(out, key=lambda r: -r.speedup)

    def unrequested(self, pending: list["Request"] | None = None) -> list[tuple[str, str]]:
        """(card, why) for each searched card with no request and no promoted kernel
        (``pending``: the requests, where the caller has read them)."""
        from ..promotion import unrequested

        return unrequested(self._ws(), pending=pending)

    def approve(self, card: str) -> list["Entry"]:
        from ..errors import ForgeError
        from ..promotion import approve

        done, left = approve(self._ws(), [card], by="forge-tui")
        if not done and left:
            raise ForgeError(f"{card} was not promoted: {left[0][1]}")
        return done

    def reject(self, card: str, reason: str = "rejected in forge-tui") -> None:
        from ..promotion import reject

        reject(self._ws(), [card], by="forge-tui", reason=reason)

    def promoted(self) -> list["Entry"]:
        from ..promotion import manifest

        return list(manifest(self._ws()).entries.values())

    # ---- the runtime ---------------------------------------------------------------------------
    def runtime_status(self) -> dict[str, Any] | None:
        from ..runtime.status import read_status

        return read_status(self.root)

    def _workload(self) -> tuple[str, Any, Any]:
        """(the workspace's own copy of its workload, or the path it was profiled from; the device;
        the dtype) as the profile ran it."""
        from ..workload import parse_dtype

        meta = self._ws().meta
        spec = str(self.root / "workload.py") if (self.root / "workload.py").is_file() else meta["workload"]["path"]
        return spec, meta.get("device"), parse_dtype(meta["dtype"]) if meta.get("dtype") else None

    def rewrites(self) -> RewriteOutcome:
        """``forge fold``, ``forge experts`` and ``forge merge`` on the workspace's workload: the
        model's batch norms folded into their convolutions, its routed experts grouped and its
        sibling linears merged, each card checked against the model's own modules, timed, and
        promoted when faster (the user's key press approves them, as running the commands does)."""
        from ..errors import ForgeError
        from ..experts import experts_workload
        from ..folding import fold_workload
        from ..merging import merge_workload

        ws = self._ws()
        spec, device, dtype = self._workload()
        lines: list[str] = []
        promoted = 0
        for name, run in (("fold", fold_workload), ("experts", experts_workload), ("merge", merge_workload)):
            try:
                cards, why, entries = run(spec, ws, device=device, dtype=dtype)
            except ForgeError as exc:
                lines.append(f"{name}: {exc}")
                continue
            lines += [f"{name}: {c.line()}" for c in cards]
            lines += [f"{name}: {path or 'the model'}: {reason}" for path, reason in sorted(why.items())]
            lines.append(f"{name}: promoted {len(entries)} card(s)")
            promoted += len(entries)
        return RewriteOutcome(lines, promoted)

    def bench(self, repeats: int = 10) -> BenchOutcome:
        """``forge bench`` on the workspace's own copy of its workload (eager against eager + forge;
        torch.compile is left out here: it takes minutes on a small machine)."""
        from ..e2e import bench

        spec, device, dtype = self._workload()
        r = bench(spec, self._ws(), device=device, dtype=dtype, repeats=repeats, warmup=2, with_compile=False)
        sp = r.speedups.get("eager+forge")
        return BenchOutcome(r.table(), sp.median if sp else None, dict(r.outputs_agree), dict(r.switched_off))
