"""The search, persisted in the workspace's git repository.

Each node is a branch ``search/<card>/<node>`` whose commit holds ``candidate/`` (the source, the
evaluator's ``result.json``, ``node.json``, the agent's transcript if any) on top of its parent's
commit, so ``git diff`` between a node and its parent shows what the child changed. The root of a
card is the eager reference (``candidate/reference.py``) on top of ``main``. Trailers carry node,
parent, card, status, speedup, cost and a global sequence number, so the tree can be rebuilt from
refs alone. Other facts (search started, card finished, stopped, promotion requested, proposer
failures) are commits on ``forge/log``, a linear chain. Sequence numbers order everything.

Damage (a commit whose trailers were lost or cut short, a ref at a missing object, a node whose
parent is gone, a log entry with bad JSON) never stops a load: :meth:`SearchStore.load` skips the
item and lists it in ``Loaded.damaged`` with what is wrong. Refs are written create-only (nodes) or
compare-and-swap (the log), so no branch is ever overwritten, damaged or not.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from ..errors import WorkspaceError
from ..gitrepo import GitRepo, ObjectWriter, format_message, list_refs, parse_trailers, read_blob, scan_refs, short_ref, walk_first_parent
from .tree import ROOT

NODE_PREFIX = "refs/heads/search/"
LOG_REF = "refs/heads/forge/log"
LOG_BRANCH = short_ref(LOG_REF)
LOG_KEPT = "refs/heads/forge/log-damaged-"
"""A log whose tip cannot be read is kept under this prefix (plus a number) when a new log starts."""
FOLDER = "candidate"
NODE_TRAILERS = ("Forge-Card", "Forge-Node", "Forge-Parent", "Forge-Status", "Forge-Speedup", "Forge-Proposer",
                 "Forge-Cost")
"""Written on every node (Forge-Move and Forge-Reason are left out when empty)."""


@dataclass
class NodeRecord:
    seq: int
    card: str
    node: str
    parent: str | None
    status: str
    speedup: float | None
    move: str
    proposer: str
    cost_usd: float
    reason: str
    commit: str
    conversation: str = ""
    """The agent's conversation that wrote the node (its transcript is the node's transcript.json)."""
    time_us: float | None = None
    """The candidate's median time in its evaluation (None: not timed, or a node recorded before
    nodes carried it)."""
    eager_us: float | None = None
    """Eager's median time in the same evaluation."""


@dataclass
class LogRecord:
    seq: int
    kind: str
    card: str | None
    node: str | None
    data: dict
    commit: str


@dataclass
class Damage:
    """A recorded item that cannot be used as it is, and what is wrong with it."""

    ref: str
    """The branch, as people name it: ``search/<card>/<node>`` or ``forge/log``."""
    what: str
    """One line: what is wrong."""
    commit: str | None = None
    card: str | None = None
    node: str | None = None
    seq: int | None = None
    skipped: bool = True
    """True: the item was left out of the search. False: it was kept, a part of it was unusable
    (a node's ``result.json``, read as no result)."""

    @property
    def where(self) -> str:
        return f"{self.ref} commit {self.commit[:12]}" if self.ref == LOG_BRANCH and self.commit else self.ref

    @property
    def line(self) -> str:
        """``skipped search/<card>/<node>: <what>`` (or ``damaged ...`` for an item that was kept)."""
        return f"{'skipped' if self.skipped else 'damaged'} {self.where}: {self.what}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Loaded:
    nodes: list[NodeRecord] = field(default_factory=list)
    log: list[LogRecord] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)
    """Items skipped (or partly unusable), in branch order: never applied to a tree."""
    taken: dict[str, set[str]] = field(default_factory=dict)
    """Per card, node ids a new node must not use: every branch under ``search/<card>/`` (damaged
    ones too) and every id a recorded node names, as itself or as its parent."""

    @property
    def max_seq(self) -> int:
        return max([r.seq for r in self.nodes] + [r.seq for r in self.log] +
                   [d.seq for d in self.damaged if d.seq is not None] + [0])

    @property
    def recorded(self) -> bool:
        """Whether anything of a search is in the repository (sound or not)."""
        return bool(self.nodes or self.log or self.damaged or any(self.taken.values()))


def _float(text: str | None) -> float | None:
    try:
        return None if text in (None, "", "none") else float(text)
    except ValueError:
        return None


def node_ref(card: str, node: str) -> str:
    return f"{NODE_PREFIX}{card}/{node}"


def _seq(t: dict[str, str]) -> int | str:
    """Forge-Seq as a number, or what is wrong with it."""
    if "Forge-Seq" not in t:
        return "no Forge-Seq trailer"
    try:
        return int(t["Forge-Seq"])
    except ValueError:
        return f"Forge-Seq {t['Forge-Seq']!r} is not a number"


def _number(t: dict[str, str], key: str) -> float | None | str:
    """A float trailer ('none': None), or what is wrong with it."""
    text = t[key]
    if text in ("", "none"):
        return None
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    return x if math.isfinite(x) else f"{key} {text!r} is not a number"


def parse_node(ref: str, commit: str, message: str) -> NodeRecord | Damage:
    """A node's record from its branch and commit message, or what is wrong with it."""
    branch = short_ref(ref)
    b_card, _, b_node = ref[len(NODE_PREFIX):].rpartition("/")
    t = parse_trailers(message)
    seq = _seq(t)

    def bad(what: str) -> Damage:
        return Damage(branch, what, commit, b_card or None, b_node or None, seq if isinstance(seq, int) else None)

    if not any(k.startswith("Forge-") for k in t):
        return bad("no Forge trailers: not a search node commit, or its trailers were lost")
    if "Forge-Event" not in t:
        return bad("no Forge-Event trailer")
    if t["Forge-Event"] != "node":
        return bad(f"Forge-Event is {t['Forge-Event']!r}, not 'node'")
    if isinstance(seq, str):
        return bad(seq)
    missing = [k for k in NODE_TRAILERS if k not in t]
    if missing:
        return bad(f"no {missing[0]} trailer (the trailer block is cut short)")
    card, node = t["Forge-Card"], t["Forge-Node"]
    if (card, node) != (b_card, b_node):
        return bad(f"trailers say card {card} node {node} but the branch is {branch}")
    speedup, cost = _number(t, "Forge-Speedup"), _number(t, "Forge-Cost")
    for x in (speedup, cost):
        if isinstance(x, str):
            return bad(x)
    parent = None if t["Forge-Parent"] in ("", "none") else t["Forge-Parent"]
    if node == ROOT and parent is not None:
        return bad(f"the root names a parent ({parent})")
    if node != ROOT and parent is None:
        return bad("Forge-Parent is none, but only the root has no parent")
    assert not isinstance(speedup, str) and not isinstance(cost, str)  # returned as damage above
    times = [_number(t, k) if k in t else None for k in ("Forge-Time-Us", "Forge-Eager-Us")]
    time_us, eager_us = (x if isinstance(x, float) and x > 0 else None for x in times)  # optional: unreadable is unknown
    return NodeRecord(seq=seq, card=card, node=node, parent=parent, status=t["Forge-Status"], speedup=speedup,
                      move=t.get("Forge-Move", ""), proposer=t["Forge-Proposer"], cost_usd=cost or 0.0,
                      reason=t.get("Forge-Reason", ""), commit=commit, conversation=t.get("Forge-Conversation", ""),
                      time_us=time_us, eager_us=eager_us)


def parse_log(commit: str, message: str) -> LogRecord | Damage:
    """A log event from its commit message, or what is wrong with it."""
    t = parse_trailers(message)
    seq = _seq(t)

    def bad(what: str) -> Damage:
        return Damage(LOG_BRANCH, what, commit, seq=seq if isinstance(seq, int) else None)

    if "Forge-Event" not in t:
        return bad("no Forge-Event trailer" if any(k.startswith("Forge-") for k in t) else
                   "no Forge trailers: not a log event, or its trailers were lost")
    if isinstance(seq, str):
        return bad(seq)
    if "Forge-Data" not in t:
        return bad("no Forge-Data trailer (the trailer block is cut short)")
    try:
        data = json.loads(t["Forge-Data"])
    except ValueError as exc:
        return bad(f"Forge-Data is not valid JSON ({exc})")
    if not isinstance(data, dict):
        return bad(f"Forge-Data is a JSON {type(data).__name__}, not an object")
    return LogRecord(seq=seq, kind=t["Forge-Event"],
                     card=None if t.get("Forge-Card") in (None, "", "none") else t["Forge-Card"],
                     node=None if t.get("Forge-Node") in (None, "", "none") else t["Forge-Node"],
                     data=data, commit=commit)


def _check_lineage(records: list[NodeRecord]) -> tuple[list[NodeRecord], list[Damage]]:
    """Nodes whose parent chain reaches their card's root, each after its parent; the others as damage."""
    by_key: dict[tuple[str, str | None], NodeRecord] = {(r.card, r.node): r for r in records}
    ok: dict[tuple[str, str | None], NodeRecord] = {}
    damaged = []
    for r in sorted(records, key=lambda r: r.seq):
        if r.node == ROOT:
            ok[(r.card, r.node)] = r
            continue
        parent = ok.get((r.card, r.parent))
        if parent is not None and parent.seq < r.seq:
            ok[(r.card, r.node)] = r
            continue
        other = by_key.get((r.card, r.parent))
        if other is not None and other.seq >= r.seq:
            what = f"Forge-Seq {r.seq} is not after its parent {r.parent}'s ({other.seq})"
        else:
            what = f"parent {r.parent} is missing or damaged"
        damaged.append(Damage(short_ref(node_ref(r.card, r.node)), what, r.commit, r.card, r.node, r.seq))
    return sorted(ok.values(), key=lambda r: r.seq), damaged


class SearchStore:
    """Reads and writes search state; every write from one thread (the search loop)."""

    def __init__(self, repo: GitRepo) -> None:
        self.repo = repo
        self.writer = ObjectWriter(repo)
        self._log_head: str | None = None
        """What ``forge/log`` holds (as load() found it, then as written): the one value it may move from."""
        self._log_parent: str | None = None
        """The commit the next event chains onto (None after an unreadable tip: a new log starts)."""

    # ---- reading -----------------------------------------------------------------------------
    def load(self) -> Loaded:
        """Every sound node and log event; everything damaged in ``damaged`` (never raises for damage)."""
        out = Loaded()
        records: list[NodeRecord] = []
        for info in scan_refs(self.repo, NODE_PREFIX):
            b_card, _, b_node = info.ref[len(NODE_PREFIX):].rpartition("/")
            if b_card:
                out.taken.setdefault(b_card, set()).add(b_node)
            if info.error or info.message is None:
                what = info.error or f"points at a {info.kind}, not a commit"
                out.damaged.append(Damage(short_ref(info.ref), what, info.sha or None, b_card or None, b_node or None))
                continue
            t = parse_trailers(info.message)
            if t.get("Forge-Card"):  # ids the trailers name stay taken, so an orphan never gets a new parent
                ids = out.taken.setdefault(t["Forge-Card"], set())
                ids.update(x for x in (t.get("Forge-Node"), t.get("Forge-Parent")) if x and x != "none")
            rec = parse_node(info.ref, info.sha, info.message)
            if isinstance(rec, NodeRecord):
                records.append(rec)
            else:
                out.damaged.append(rec)
        out.nodes, orphans = _check_lineage(records)
        out.damaged.extend(orphans)
        out.damaged.sort(key=lambda d: (d.ref, d.seq or 0))
        log_damage = self._load_log(out)
        out.log.sort(key=lambda r: r.seq)
        out.damaged.extend(sorted(log_damage, key=lambda d: d.seq or 0))
        return out

    def _load_log(self, out: Loaded) -> list[Damage]:
        damaged: list[Damage] = []
        tip = self.repo.read_ref(LOG_REF)
        self._log_head = self._log_parent = tip
        if tip is None:
            return damaged
        try:
            text = self.repo.git("log", "--format=%H%x00%B%x00%x00", LOG_REF)
            entries = []
            for chunk in text.split("\x00\x00"):
                chunk = chunk.strip("\n")
                if chunk:
                    commit, message = chunk.split("\x00", 1)
                    entries.append((commit, message))
        except WorkspaceError:  # a commit of the chain is missing or corrupt: walk it one object at a time
            entries, why, at = walk_first_parent(self.repo, tip)
            if not entries:
                self._log_parent = None  # nothing to chain onto: the next event starts a new log
                why = f"{why}; a new log starts, the old tip is kept as {short_ref(LOG_KEPT)}<n>"
            damaged.append(Damage(LOG_BRANCH, why or "the log cannot be read", at))
        for commit, message in entries:
            rec = parse_log(commit, message)
            if isinstance(rec, LogRecord):
                out.log.append(rec)
            else:
                damaged.append(rec)
        return damaged

    def read(self, commit: str, name: str) -> bytes | None:
        """A file of a node's ``candidate/``; None when absent; WorkspaceError when it cannot be read."""
        return read_blob(self.repo, commit, f"{FOLDER}/{name}")

    # ---- writing -----------------------------------------------------------------------------
    def write_node(self, rec: NodeRecord, files: dict[str, bytes], base_commit: str) -> str:
        trailers = {
            "Forge-Event": "node", "Forge-Seq": rec.seq, "Forge-Card": rec.card, "Forge-Node": rec.node,
            "Forge-Parent": rec.parent or "none", "Forge-Status": rec.status,
            "Forge-Speedup": "none" if rec.speedup is None else repr(float(rec.speedup)),
            "Forge-Proposer": rec.proposer or "none", "Forge-Cost": repr(float(rec.cost_usd)),
            "Forge-Move": _one_line(rec.move), "Forge-Reason": _one_line(rec.reason)[:300],
        }
        if rec.conversation:
            trailers["Forge-Conversation"] = rec.conversation
        if rec.time_us and rec.eager_us:
            trailers["Forge-Time-Us"] = repr(float(rec.time_us))
            trailers["Forge-Eager-Us"] = repr(float(rec.eager_us))
        subject = f"{rec.card} {rec.node}: {rec.status}" + (f" {rec.speedup:.3f}x" if rec.speedup else "")
        parents = [base_commit]
        commit = self.writer.commit_files(base_commit, FOLDER, files, parents, format_message(subject, rec.move, trailers))
        self.writer.update_ref(node_ref(rec.card, rec.node), commit, old=None)  # create-only: RefConflict if it exists
        rec.commit = commit
        return commit

    def write_log(self, rec: LogRecord, files: dict[str, bytes] | None = None) -> str:
        """Append an event to the log; ``files`` are kept with it (an agent's transcript)."""
        trailers = {"Forge-Event": rec.kind, "Forge-Seq": rec.seq, "Forge-Card": rec.card or "none",
                    "Forge-Node": rec.node or "none", "Forge-Data": json.dumps(rec.data, sort_keys=True, default=str)}
        subject = f"{rec.kind}" + (f" {rec.card}" if rec.card else "") + (f" {rec.node}" if rec.node else "")
        files = {"event.json": json.dumps({"kind": rec.kind, "seq": rec.seq, "card": rec.card, "node": rec.node,
                                           "data": rec.data}, indent=1, default=str).encode(), **(files or {})}
        # The log is a chain of its own (no link to main): it holds events, not the workspace.
        if self._log_head is not None and self._log_parent is None:
            self._keep_unreadable_log()
        parents = [self._log_parent] if self._log_parent else []
        commit = self.writer.commit_files(None, "forge-log", files, parents, format_message(subject, "", trailers))
        self.writer.update_ref(LOG_REF, commit, old=self._log_head)  # only from where load() found it
        self._log_head = self._log_parent = commit
        rec.commit = commit
        return commit

    def _keep_unreadable_log(self) -> None:
        """Before a new log replaces one whose tip cannot be read, keep the old tip on a branch of its own."""
        n = 1
        while self.repo.read_ref(f"{LOG_KEPT}{n}") is not None:
            n += 1
        if self._log_head is not None:
            self.writer.update_ref(f"{LOG_KEPT}{n}", self._log_head, old=None)

    def delete_all(self) -> int:
        """Remove every search ref and the log (``forge search --fresh``)."""
        rows, broken = list_refs(self.repo, NODE_PREFIX, LOG_REF, f"{LOG_KEPT}*")
        refs = [r for r, _ in rows] + broken
        for r in refs:
            self.repo.delete_ref(r)
        self._log_head = self._log_parent = None
        return len(refs)


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


__all__ = ["SearchStore", "NodeRecord", "LogRecord", "Loaded", "Damage", "ROOT", "node_ref", "parse_node", "parse_log"]
