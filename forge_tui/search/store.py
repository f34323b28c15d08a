"""The search, persisted in the workspace's git repository.

Each node is a branch ``search/<card>/<node>`` whose commit holds ``candidate/`` (the source, the
evaluator's ``result.json``, ``node.json``, the agent's transcript if any) on top of its parent's
commit, so ``git diff`` between a node and its parent shows what the child changed. The root of a
card is the eager reference (``candidate/reference.py``) on top of ``main``. Trailers carry node,
parent, card, status, speedup, cost and a global sequence number, so the tree can be rebuilt from
refs alone. Other facts (search started, card finished, stopped, promotion requested, proposer
failures) are commits on ``forge/log``, a linear chain. Sequence numbers order everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..gitrepo import GitRepo, ObjectWriter, for_each_ref, format_message, parse_trailers, read_blob
from .tree import ROOT

NODE_PREFIX = "refs/heads/search/"
LOG_REF = "refs/heads/forge/log"
FOLDER = "candidate"


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


@dataclass
class LogRecord:
    seq: int
    kind: str
    card: str | None
    node: str | None
    data: dict
    commit: str


@dataclass
class Loaded:
    nodes: list[NodeRecord] = field(default_factory=list)
    log: list[LogRecord] = field(default_factory=list)

    @property
    def max_seq(self) -> int:
        return max([r.seq for r in self.nodes] + [r.seq for r in self.log] + [0])


def _float(text: str | None) -> float | None:
    try:
        return None if text in (None, "", "none") else float(text)
    except ValueError:
        return None


def node_ref(card: str, node: str) -> str:
    return f"{NODE_PREFIX}{card}/{node}"


class SearchStore:
    """Reads and writes search state; every write from one thread (the search loop)."""

    def __init__(self, repo: GitRepo) -> None:
        self.repo = repo
        self.writer = ObjectWriter(repo)
        self._log_head: str | None = None

    # ---- reading -----------------------------------------------------------------------------
    def load(self) -> Loaded:
        out = Loaded()
        for ref, commit, message in for_each_ref(self.repo, NODE_PREFIX):
            t = parse_trailers(message)
            if t.get("Forge-Event") != "node":
                continue
            out.nodes.append(NodeRecord(
                seq=int(t["Forge-Seq"]), card=t["Forge-Card"], node=t["Forge-Node"],
                parent=None if t.get("Forge-Parent") in (None, "", "none") else t["Forge-Parent"],
                status=t.get("Forge-Status", "?"), speedup=_float(t.get("Forge-Speedup")),
                move=t.get("Forge-Move", ""), proposer=t.get("Forge-Proposer", ""),
                cost_usd=_float(t.get("Forge-Cost")) or 0.0, reason=t.get("Forge-Reason", ""), commit=commit))
        out.nodes.sort(key=lambda r: r.seq)
        try:
            text = self.repo.git("log", "--format=%H%x00%B%x00%x00", LOG_REF)
        except Exception:  # noqa: BLE001 - no log yet
            text = ""
        for chunk in text.split("\x00\x00"):
            chunk = chunk.strip("\n")
            if not chunk:
                continue
            commit, message = chunk.split("\x00", 1)
            t = parse_trailers(message)
            if "Forge-Seq" not in t or "Forge-Event" not in t:
                continue
            data = json.loads(t.get("Forge-Data", "{}"))
            out.log.append(LogRecord(seq=int(t["Forge-Seq"]), kind=t["Forge-Event"],
                                     card=None if t.get("Forge-Card") in (None, "none") else t["Forge-Card"],
                                     node=None if t.get("Forge-Node") in (None, "none") else t["Forge-Node"],
                                     data=data, commit=commit))
        out.log.sort(key=lambda r: r.seq)
        if out.log:
            self._log_head = max(out.log, key=lambda r: r.seq).commit
        return out

    def read(self, commit: str, name: str) -> bytes | None:
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
        subject = f"{rec.card} {rec.node}: {rec.status}" + (f" {rec.speedup:.3f}x" if rec.speedup else "")
        parents = [base_commit]
        commit = self.writer.commit_files(base_commit, FOLDER, files, parents, format_message(subject, rec.move, trailers))
        self.writer.set_ref(node_ref(rec.card, rec.node), commit)
        rec.commit = commit
        return commit

    def write_log(self, rec: LogRecord) -> str:
        trailers = {"Forge-Event": rec.kind, "Forge-Seq": rec.seq, "Forge-Card": rec.card or "none",
                    "Forge-Node": rec.node or "none", "Forge-Data": json.dumps(rec.data, sort_keys=True, default=str)}
        subject = f"{rec.kind}" + (f" {rec.card}" if rec.card else "") + (f" {rec.node}" if rec.node else "")
        files = {"event.json": json.dumps({"kind": rec.kind, "seq": rec.seq, "card": rec.card, "node": rec.node,
                                           "data": rec.data}, indent=1, default=str).encode()}
        # The log is a chain of its own (no link to main): it holds events, not the workspace.
        parents = [self._log_head] if self._log_head else []
        commit = self.writer.commit_files(None, "forge-log", files, parents, format_message(subject, "", trailers))
        self.writer.set_ref(LOG_REF, commit)
        self._log_head = commit
        rec.commit = commit
        return commit

    def delete_all(self) -> int:
        """Remove every search ref and the log (``forge search --fresh``)."""
        refs = [r for r, _, _ in for_each_ref(self.repo, NODE_PREFIX)] + \
            [r for r, _, _ in for_each_ref(self.repo, LOG_REF)]
        for r in refs:
            self.repo.git("update-ref", "-d", r)
        self._log_head = None
        return len(refs)


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


__all__ = ["SearchStore", "NodeRecord", "LogRecord", "Loaded", "ROOT", "node_ref"]
