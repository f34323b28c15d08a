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
    from ..profiler.retime import CardRetime
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
class Variant:
    """One way the forward ran in ``forge bench``: its time (median, quartiles, µs) and outputs."""

    name: str
    median: float
    q1: float
    q3: float
    outputs: str = "agree"


@dataclass
class BenchOutcome:
    """``forge bench`` as the fallback screen shows it: one table whose ratio is the two medians it
    shows, the paired runs' ratio said apart as such, and the Amdahl bound of the served cards."""

    variants: list[Variant] = field(default_factory=list)
    paired: tuple[float, float, float] | None = None
    """eager + forge against eager, forward by forward (each forward of one beside one of the
    other): the median ratio and its quartiles."""
    bound: float | None = None
    """The Amdahl bound: 1 / (1 - sum of f x (1 - 1/s)) over the served cards, f a card's share of
    eager's forward and s its speedup, both from this run's own times where it has them."""
    bound_why: str = ""
    """What the bound is computed from, or why there is none."""
    outputs_agree: dict[str, str | None] = field(default_factory=dict)
    switched_off: dict[str, str] = field(default_factory=dict)
    """Kernels switched off because the whole forward ran faster without them."""
    notes: list[str] = field(default_factory=list)

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def speedup(self) -> float | None:
        """eager's median over eager + forge's: the ratio the table shows."""
        e, f = self.variant("eager"), self.variant("eager+forge")
        return e.median / f.median if e is not None and f is not None and f.median > 0 else None

    def disagree(self) -> bool:
        """Whether the medians' ratio and the paired runs' fall on either side of 1 (eager's and
        the served forward's times moved while they ran: a busy machine)."""
        sp = self.speedup
        return sp is not None and self.paired is not None and (sp - 1.0) * (self.paired[0] - 1.0) < 0

    def render(self) -> str:
        e = self.variant("eager")
        lines = [f"{'variant':13s} {'median µs':>10s} {'q1 - q3 µs':>21s} {'vs eager':>9s}  outputs"]
        for v in self.variants:
            ratio = "-" if e is None or v is e or v.median <= 0 else f"{e.median / v.median:.3f}x"
            lines.append(f"{v.name:13s} {v.median:10.1f} {v.q1:10.1f} - {v.q3:8.1f} {ratio:>9s}  {v.outputs}")
        lines.append("vs eager: eager's median over the variant's median (the times above)")
        if self.paired is not None:
            m, q1, q3 = self.paired
            lines.append(f"paired runs (each forward beside one of eager): eager + forge {m:.3f}x [{q1:.3f}, {q3:.3f}]"
                         + ("; the two ratios disagree: the machine was busy, b runs it again" if self.disagree() else ""))
        if self.bound is not None:
            lines.append(f"Amdahl bound {self.bound:.3f}x: {self.bound_why}")
        elif self.bound_why:
            lines.append(f"no Amdahl bound: {self.bound_why}")
        for card, why in self.switched_off.items():
            lines.append(f"switched off {card} (a measurement of its own): {why}")
        lines.extend(self.notes)
        return "\n".join(lines)

    @property
    def table(self) -> str:
        return self.render()

    def guide(self) -> str:
        """The guide's line on it (the same ratio as the table's)."""
        bad = [k for k, v in self.outputs_agree.items() if v and "forge" in k]
        sp = self.speedup
        got = f"{sp:.2f}x eager" if sp else "measured"
        off = f"; {len(self.switched_off)} kernel(s) switched off, slower end to end (3 says why)" \
            if self.switched_off else ""
        busy = " (the paired runs disagree: b runs it again)" if self.disagree() else ""
        return f"end to end: eager + forge {got}{busy}, outputs " + ("DIFFER" if bad else "agree") + off

    @classmethod
    def of(cls, r: Any, cards: "list[Card]", promoted: "list[Entry]") -> "BenchOutcome":
        """From ``e2e.bench``'s result, the workspace's cards and its promoted kernels."""
        variants = []
        for name, st in r.times.items():
            agree, acc = r.outputs_agree.get(name), r.accuracy.get(name)
            said = "-" if name == "eager" else ("agree" if agree is None else agree)
            if agree is None and acc:
                said = f"as accurate as {acc['baseline']} against the model in fp32"
            variants.append(Variant(name, st.median, st.q1, st.q3, said))
        sp = r.speedups.get("eager+forge")
        paired = (sp.median, sp.q1, sp.q3) if sp is not None else None
        bound, why = amdahl(r, cards, promoted)
        return cls(variants, paired, bound, why, dict(r.outputs_agree), dict(r.switched_off), list(r.notes))


def amdahl(r: Any, cards: "list[Card]", promoted: "list[Entry]") -> tuple[float | None, str]:
    """The Amdahl bound of the cards the run served, and what it is computed from (or why none):
    each card's share of eager's forward and its speedup from the card's own times in this run
    (eager's ops and the served call, timed on its captured inputs); a card without them (a fold,
    experts or merge card) from its profiled share, where its time is trusted, and its evidence."""
    from ..profiler.trust import distrust

    eager = r.times.get("eager")
    served = [c for c, n in r.served.items() if n and c not in r.switched_off]
    if eager is None or eager.median <= 0 or not served:
        return None, "no kernel served" if eager is not None else ""
    by_id = {c.id: c for c in cards}
    evidence = {e.card: e.evidence for e in promoted}
    saved, parts = 0.0, []
    for card in served:
        c = by_id.get(card)
        own = r.own_times.get(card)
        if own is not None and c is not None and c.calls and own[0] > 0 and own[1] > 0:
            f, s = c.calls * own[0] / eager.median, own[0] / own[1]
        elif c is not None and c.share is not None and distrust(c) is None and evidence.get(card) is not None \
                and evidence[card].speedup_vs_eager:
            f, s = c.share, float(evidence[card].speedup_vs_eager or 1.0)
        else:
            return None, f"{card} has neither its own times in this run nor a trusted share of the forward"
        saved += f * (1 - 1 / s)
        parts.append(f"{card} {100 * f:.1f}% of eager's forward at {s:.2f}x")
    if saved >= 1.0:
        return None, "the served cards' own times add up to more than the forward (the machine was busy)"
    return 1 / (1 - saved), "; ".join(parts)


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

    def offline_lines(self, cards: list["Card"]) -> dict[str, str]:
        """Per card, which offline kernel serves it, or why none (the card pane's line; the
        templates it asks import torch, so a worker asks)."""
        from .offline import offline_line

        return {c.id: offline_line(c) for c in cards}

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

    def retime(self, config: Path | None = None, *, settings: dict[str, Any] | None = None,
               bus: "EventBus | None" = None, on_search: "Callable[[Search], None] | None" = None) -> list[str]:
        """``forge retime``: each kernel a busy machine left untimed, evaluated once again; a line
        each. ``bus``: the search's events (the app's live tree); ``on_search``: handed the search
        before it starts (the app stops it with x or q)."""
        from ..session import Session

        session = Session.open(self.root, config).with_search_settings(**(settings or {}))
        with session.search(proposer="templates", backend=session.profiled_backend(), bus=bus) as search:
            if on_search is not None:
                on_search(search)
            search.retime()
        return search.retime_lines()

    def untimed(self) -> int:
        """How many kernels wait to be timed again (``search.retime.untimed`` over every card)."""
        from ..search.retime import untimed
        from ..search.store import SearchStore

        by_card: dict[str, list[tuple[int, str, str, str]]] = {}
        with self._ws().git() as repo:
            for rec in SearchStore(repo).load().nodes:
                by_card.setdefault(rec.card, []).append((rec.seq, rec.node, rec.status, rec.move))
        return sum(len(untimed((n, st, mv) for _, n, st, mv in sorted(rows))) for rows in by_card.values())

    def budget(self, config: Path | None = None, settings: dict[str, Any] | None = None) -> tuple[int, int]:
        """(evaluations, evaluations per card) a search in the app runs: the ``[search]`` budgets
        found for the workspace, with the app's own settings over them."""
        from ..config import discover_config

        cfg, _ = discover_config(config, self.root)
        s = {**cfg.search.model_dump(), **(settings or {})}
        return int(s["max_evals"]), int(s["evals_per_card"])

    def retime_cards(self, stop: "Callable[[], bool]" = lambda: False,
                     progress: "Callable[[str], None]" = lambda line: None) -> "CardRetime":
        """The cards whose profiled time is not trusted, timed again if the machine is quiet now
        (``profiler.retime``)."""
        from ..workspace import retime_cards

        return retime_cards(self._ws(), progress=progress, stop=stop)

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
        """Every rewrite in the registry (``forge fold``, ``forge experts``, ``forge merge``), in
        order, on the workspace's workload: the model's batch norms folded into their convolutions,
        its routed experts grouped and its sibling linears merged, each card checked against the
        model's own modules, timed, and promoted when faster (the user's key press approves them,
        as running the commands does)."""
        from ..errors import ForgeError
        from ..rewrites import REWRITES

        ws = self._ws()
        spec, device, dtype = self._workload()
        lines: list[str] = []
        promoted = 0
        for name, rewrite in REWRITES.items():
            try:
                cards, why, entries = rewrite.run(spec, ws, device=device, dtype=dtype)
            except ForgeError as exc:
                lines.append(f"{name}: {exc}")
                continue
            lines += [f"{name}: {c.line()}" for c in cards]
            lines += [f"{name}: {path or 'the model'}: {reason}" for path, reason in sorted(why.items())]
            lines.append(f"{name}: promoted {len(entries)} card(s)")
            promoted += len(entries)
        return RewriteOutcome(lines, promoted)

    def generation(self) -> dict[str, Any] | None:
        """The workspace's last ``forge bench --generate`` result (``generation_result.py``), or None."""
        from ..generation_result import load

        return load(self.root)

    GENERATE_TOKENS = 16
    """New tokens the app's generation bench asks for at most (the workload's own, fewer where it
    asks for more): a run the user waits for, a few rounds on a small machine."""

    def generates(self) -> bool:
        """Whether the workspace's workload generates (defines ``generate(model, inputs)``)."""
        from ..workload import load_workload

        spec, _, _ = self._workload()
        return callable(getattr(load_workload(spec).module, "generate", None))

    def bench_generate(self, repeats: int = 3) -> dict[str, Any] | None:
        """``forge bench --generate`` on the workspace's own copy of its workload, where it
        generates (a ``generate`` entry): eager against eager + forge at the workload's batches,
        its new tokens up to ``GENERATE_TOKENS`` (torch.compile left out, as ``bench`` leaves it),
        stored in the workspace (``generation_result.py``). None where the workload does not
        generate."""
        from ..generation.bench import generate_bench
        from ..generation_result import save
        from ..workload import load_workload

        spec, device, dtype = self._workload()
        module = load_workload(spec).module
        if not callable(getattr(module, "generate", None)):
            return None
        own = getattr(module, "NEW_TOKENS", None)
        new = min(own, self.GENERATE_TOKENS) if isinstance(own, int) and own >= 2 else self.GENERATE_TOKENS
        r = generate_bench(spec, self._ws(), new, device=device, dtype=dtype, repeats=repeats, with_compile=False)
        data = r.to_json()
        save(self.root, data)
        return data

    def bench(self, repeats: int = 10) -> BenchOutcome:
        """``forge bench`` on the workspace's own copy of its workload (eager against eager + forge;
        torch.compile is left out here: it takes minutes on a small machine)."""
        from ..e2e import BenchOptions, bench

        spec, device, dtype = self._workload()
        ws = self._ws()
        r = bench(spec, ws, BenchOptions(device=device, dtype=dtype, repeats=repeats, warmup=2, with_compile=False))
        return BenchOutcome.of(r, ws.cards(), self.promoted())
