"""The search loop: pick a card by expected gain, select a node by UCT, ask the proposer for a
child, evaluate it, commit it to git, back the reward up, publish events.

Proposals and evaluations run in worker threads (several in flight); every git write and every
change to the trees happens on the loop's own thread, so the repository stays consistent. A
failing proposer (an LLM API error) or a crashing candidate is recorded and the search goes on.
``kill -9`` at any moment loses only what was in flight: every finished node is a committed ref.
Damaged records (see :mod:`.store`) are left out and reported (``store_damaged`` events, ``damaged``);
new node ids never reuse a branch name, damaged or not.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from ..cards import Card, CardKind, id_matches, not_served
from ..config import ForgeConfig
from ..errors import ForgeError, WorkspaceError
from ..evaluator.result import EvalResult, load_result
from ..gitrepo import RefConflict, short_ref
from ..kernel_abi import SOURCE_NAMES
from ..profiler.trust import distrust, rank_shares
from ..program import program_source
from ..promotion import manifest
from ..rewrites import REWRITES
from ..workspace import Workspace
from .budget import CardBudget, pick
from .events import BudgetSpent, EventBus, NodeStarted, SearchEvent, StoreDamaged
from .history import History
from .ledger import Ledger
from .pool import EvalPool, PoolLost
from .proposer import NodeView, Proposal, ProposalContext, Proposer, ProposerFailure
from .retime import NO_VERDICT, RETIME, untimed
from .store import FOLDER, Damage, LogRecord, NodeRecord, SearchStore, node_ref
from .tree import EXPANDABLE_STATUSES, ROOT, CardTree, Node
from .uct import select

NOTHING_MORE = "the proposer has nothing more to try"

INELIGIBLE_FLAGS = {"dynamic_shape": "its output shape depends on the data",
                    "replay_failed": "its reference could not be replayed",
                    "reference_mismatch": "its reference does not reproduce the captured output"}


BUDGET_SPENT = "its budget of "
"""How a card's finish begins when its own evaluation budget was spent (``CardBudget.stop_reason``):
a resumed search with a larger budget reopens it."""

def replaced_sites(ws: Workspace) -> dict[str, str]:
    """Module path -> the enabled promoted card of a rewrite in the registry (``REWRITES``) that
    replaces what runs there: a fold's batch norms, an experts card's blocks (everything inside
    them), a merge's linears."""
    rewrites = {r.kind for r in REWRITES.values()}
    out: dict[str, str] = {}
    for card, e in sorted(manifest(ws).entries.items()):
        if e.signature.kind in rewrites and e.enabled:
            for path in e.signature.module_paths:
                out.setdefault(path, card)
    return out


def replaced_by(card: Card, sites: dict[str, str]) -> str | None:
    """The rewrite card (``replaced_sites``) that replaces every call of ``card``: each of the
    module paths its calls are made in lies at or inside one of its sites. None where one does
    not (or the card has no module path: ops of the model's own forward)."""
    if not sites or not card.module_paths:
        return None
    owners = []
    for path in card.module_paths:
        parts = path.split(".")
        at = [p for p in (".".join(parts[:k]) for k in range(len(parts), 0, -1)) if p in sites]
        if not at:
            return None
        owners.append(sites[at[0]])
    return owners[0]


@dataclass
class SearchSummary:
    evaluations: int
    stopped: str
    best: dict[str, dict]
    skipped: dict[str, str]
    wall_s: float
    git_s: float
    cost_usd: float
    events: int = 0
    finished: dict[str, str] = field(default_factory=dict)
    damaged: list[Damage] = field(default_factory=list)
    """Recorded items the search left out (or read in part), each with its branch and what is wrong."""
    git_failure: str | None = None
    """Why git failed, when it did (the search stopped there, every finished node kept)."""
    pool_failure: str | None = None
    """Why the evaluation pool was lost, when it was (a cluster's scheduler gone): the search
    stopped there, every finished node kept, nothing recorded for the evaluations in flight."""


class Search:
    def __init__(self, ws: Workspace, cfg: ForgeConfig, proposer: Proposer, pool: EvalPool, *,
                 bus: EventBus | None = None, cards: list[str] | None = None) -> None:
        self.ws = ws
        self.cfg = cfg
        self.scfg = cfg.search
        self.proposer = proposer
        self.pool = pool
        self.backend = pool.backend
        self.bus = bus or EventBus()
        self.card_filter = cards
        self.trees: dict[str, CardTree] = {}
        self.budgets: dict[str, CardBudget] = {}
        self.cards: dict[str, Card] = {}
        self.skipped: dict[str, str] = {}
        self.history = History()
        self.seq = 0
        self.sources: dict[tuple[str, str], str | None] = {}
        self.results: dict[tuple[str, str], EvalResult | None] = {}
        self.damaged: list[Damage] = []
        self._unreadable: set[tuple[str, str]] = set()
        """Nodes whose files git cannot read: never expanded (no child can be written on them)."""
        self.taken: dict[str, set[str]] = {}
        """Per card, node ids a new node must not take (every branch name seen, damaged ones too)."""
        self.evals_total = 0
        self.ledger = Ledger(self.scfg.max_cost_usd, cfg.agent.max_cost_per_card_usd or None)
        """Money: what every run spent (from the history) and what queries in flight may spend."""
        self._recheck_support = False
        self.git_s = 0.0
        self._repo_cm = None
        self.store: SearchStore | None = None
        self._stop_requested: str | None = None
        self.git_failure: str | None = None
        """Why git failed, when it did: the search then stopped, every finished node kept."""
        self.pool_failure: str | None = None
        """Why the pool was lost (``PoolLost``), when it was: the search stopped there."""
        self._main_commit = ""
        self._conversations: set[str] = set()
        """Agent conversations already recorded (on a node or in the log)."""
        self.retimed: list[tuple[str, str, Node]] = []
        """(card, noisy node, its new child) for each kernel ``retime`` timed again."""
        self._git_lock = threading.Lock()
        """Held while a record is written (``abandon`` takes it so that none is cut short)."""

    # ---- events --------------------------------------------------------------------------------
    def _publish(self, events: list[SearchEvent]) -> None:
        for e in events:
            self.bus.publish(e)

    def _damage(self, d: Damage) -> None:
        """Note a damaged item: kept in ``damaged``, published as a ``StoreDamaged`` event."""
        self.damaged.append(d)
        self.bus.publish(StoreDamaged(seq=self.seq, card=d.card, node=d.node, ref=d.ref, what=d.what,
                                      commit=d.commit, skipped=d.skipped, text=d.line))

    @property
    def cost_total(self) -> float:
        return self.ledger.spent

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Thread-safe: the loop stops starting new evaluations and records why."""
        self._stop_requested = reason

    def abandon(self, timeout: float = 0.5) -> bool:
        """For a process about to end at once (the app quitting): stop, wait up to ``timeout`` s
        for a record being written and let no other start, then end the evaluations in flight
        (the pool's judges killed; nothing of them is recorded). Every finished node is already a
        committed ref. Whether the write lock was taken (False: a write was still going on)."""
        self.request_stop("the app quit")
        held = self._git_lock.acquire(timeout=timeout)
        kill = getattr(self.pool, "kill", None)
        if kill is not None:
            kill()
        return held

    # ---- state ---------------------------------------------------------------------------------
    def _eligible(self, all_cards: list[Card]) -> list[Card]:
        """The cards to search, each other card's reason in ``skipped``. A card whose profiled time
        is not trusted (timed on a busy machine) takes part with the share the op table ranks it
        by, from its bytes and FLOPs (``profiler.trust``): the search must not rank on nonsense."""
        out = []
        sites = replaced_sites(self.ws)
        rank = rank_shares(all_cards)
        all_cards = [c.model_copy(update={"share": rank[c.id]}) if distrust(c) else c for c in all_cards]
        for card in all_cards:
            if self.card_filter and not any(id_matches(card.id, p) for p in self.card_filter):
                continue
            why = next((msg for flag, msg in INELIGIBLE_FLAGS.items() if flag in card.flags), None)
            if why is None and (never := not_served(card.kind, card.flags)) is not None:
                why = f"the runtime would never use its kernel: {never}"
            if why is None and (rewrite := replaced_by(card, sites)) is not None:
                why = f"every call of it is replaced by the promoted {rewrite}"
            if why is None and (card.share or 0.0) < self.scfg.min_share:
                why = f"its share ({100 * (card.share or 0):.2f}%) is below min_share"
            if why is None and card.time_us is None:
                why = "it has no measured time"
            if why is None:
                why = self.proposer.supports(card, self.backend)
            if why is None:
                out.append(card)
            else:
                self.skipped[card.id] = why
        eligible = {c.id for c in out}
        nested = [c for c in out if self._nested_in(c, eligible)]
        out = [c for c in out if c not in nested]
        if self.scfg.top:
            out.sort(key=lambda c: -CardBudget(c).potential)
            for c in out[self.scfg.top:]:
                self.skipped[c.id] = f"not among the top {self.scfg.top} cards by potential gain"
            out = out[: self.scfg.top]
        self._skip_nested(nested, {c.id for c in out})
        return out

    @staticmethod
    def _nested_in(card: Card, ids: set[str]) -> bool:
        """An op card every call of which runs inside module or chain cards of ``ids``."""
        return card.kind == CardKind.OP and bool(card.within) and all(p in ids for p in card.within)

    def _skip_nested(self, nested: list[Card], searched: set[str]) -> None:
        """Op cards nested in module cards are not searched apart: the module card's kernel runs in
        their place (an RMSNorm's kernel, not its mul, pow, mean and casts). Each says whether that
        card is searched, or why not (named on their own in ``cards``, without their module card,
        they are searched). Decided once the cards to search are chosen, so that no op card is
        left out "because" a module card is searched that the same search leaves out."""
        for card in nested:
            inside = card.within[0]
            if inside in searched:
                self.skipped[card.id] = f"it runs inside {inside}, whose kernel serves it (that card is searched)"
            else:
                why = self.skipped.get(inside, "it is not searched")
                self.skipped[card.id] = f"it runs inside {inside}, which is not searched either ({why})"

    def _apply_node(self, rec: NodeRecord) -> list[SearchEvent]:
        tree = self.trees.setdefault(rec.card, CardTree(rec.card, self.scfg.reward_cap))
        tree.add(Node(card=rec.card, id=rec.node, parent=rec.parent, seq=rec.seq, status=rec.status,
                      speedup=rec.speedup, move=rec.move, proposer=rec.proposer, commit=rec.commit,
                      cost_usd=rec.cost_usd, reason=rec.reason, time_us=rec.time_us, eager_us=rec.eager_us))
        events = self.history.node(rec)
        b = self.budgets.get(rec.card)
        if rec.node != ROOT:
            self.evals_total += 1
            if b is not None:
                b.evals += 1
                if rec.status in ("passed",) and rec.speedup:
                    # the card's best's speedup (``CardTree.best``, which the history has just
                    # weighed), not the largest paired ratio: one ratio against a slow sample of
                    # eager must not say the floor is reached
                    b.best_speedup = self.history.best.get(rec.card, 1.0)
        return events

    @property
    def _store(self) -> SearchStore:
        """The git store of the search in progress (open from the start of ``run``)."""
        if self.store is None:
            raise ForgeError("the search's store is opened by run()")
        return self.store

    def _load(self, resume: bool) -> None:
        loaded = self._store.load()
        if loaded.recorded and not resume:
            damaged = f", {len(loaded.damaged)} damaged items" if loaded.damaged else ""
            raise ForgeError(f"{self.ws.root} already holds a search ({len(loaded.nodes)} nodes{damaged}): "
                             "continue it with --resume, or discard it with --fresh")
        self.seq = loaded.max_seq
        self.taken = {card: set(ids) for card, ids in loaded.taken.items()}
        for d in loaded.damaged:
            self._damage(d)
        for card in self._eligible(self.ws.cards()):
            self.cards[card.id] = card
            self.budgets[card.id] = CardBudget(card)
        items: list[tuple[int, int, NodeRecord | LogRecord]] = sorted(
            [(r.seq, 0, r) for r in loaded.nodes] + [(r.seq, 1, r) for r in loaded.log], key=lambda x: (x[0], x[1]))
        for _, _, rec in items:
            if isinstance(rec, NodeRecord):
                self._apply_node(rec)
                self.ledger.charge(rec.card, rec.cost_usd)
                if rec.conversation:
                    self._conversations.add(rec.conversation)
            else:
                self.history.log(rec)
                cost = rec.data.get("cost_usd") if rec.kind in ("proposer_failed", "agent_interrupted") else None
                if isinstance(cost, (int, float)) and cost > 0:
                    self.ledger.charge(rec.card or "", float(cost))
                if rec.data.get("conversation"):
                    self._conversations.add(str(rec.data["conversation"]))
                if rec.kind == "card_finished" and rec.card in self.budgets:
                    self.budgets[rec.card].finished = rec.data.get("reason", "finished")
        for b in self.budgets.values():
            # a card that stopped on its own budget, since raised, is searched again
            if b.finished is not None and b.finished.startswith(BUDGET_SPENT) and b.evals < self.scfg.evals_per_card:
                b.finished = None
        for cid in list(self.cards):  # a damaged root (or one gone that nodes still name) is never replaced
            tree = self.trees.get(cid)
            if (tree is None or tree.root is None) and ROOT in self.taken.get(cid, ()):
                self.skipped[cid] = f"its root branch {short_ref(node_ref(cid, ROOT))} is damaged or missing"
                del self.cards[cid], self.budgets[cid]

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _log(self, kind: str, card: str | None = None, node: str | None = None, *,
             files: dict[str, bytes] | None = None, **data: Any) -> None:
        with self._git_lock:
            rec = LogRecord(self._next_seq(), kind, card, node, data, "")
            t0 = time.perf_counter()
            self._store.write_log(rec, files)
            self.git_s += time.perf_counter() - t0
        self._publish(self.history.log(rec))

    def _commit_node(self, rec: NodeRecord, files: dict[str, bytes], base: str) -> None:
        with self._git_lock:
            t0 = time.perf_counter()
            self._store.write_node(rec, files, base)
            self.git_s += time.perf_counter() - t0
        self._publish(self._apply_node(rec))

    def _ensure_root(self, card: Card) -> None:
        tree = self.trees.get(card.id)
        if tree is not None and tree.root is not None:
            return
        ref = program_source(card.program, len(card.inputs))
        files = {"reference.py": ref.encode(), "card.json": json.dumps(card.model_dump(mode="json"), indent=1).encode(),
                 "node.json": json.dumps({"card": card.id, "node": ROOT, "status": "reference"}).encode()}
        rec = NodeRecord(self._next_seq(), card.id, ROOT, None, "reference", 1.0, "eager PyTorch (the fallback)",
                         "reference", 0.0, "", "")
        self._commit_node(rec, files, self._main_commit)

    # ---- proposals ------------------------------------------------------------------------------
    def _read(self, card_id: str, node: Node, name: str) -> bytes | None:
        """A file of a node; None (and a note in ``damaged``) when git cannot read it."""
        try:
            return self._store.read(node.commit, name)
        except WorkspaceError as exc:
            self._unreadable.add((card_id, node.id))
            self._damage(Damage(short_ref(node_ref(card_id, node.id)), f"{FOLDER}/{name} cannot be read ({exc}): "
                                "the node gets no children", node.commit, card_id, node.id, node.seq, skipped=False))
            return None

    def _source(self, card_id: str, node: Node) -> str | None:
        key = (card_id, node.id)
        if key not in self.sources:
            name = "reference.py" if node.id == ROOT else SOURCE_NAMES.get(self.backend, SOURCE_NAMES["cuda"])
            data = self._read(card_id, node, name)
            if data is None and node.id != ROOT:
                data = self._read(card_id, node, SOURCE_NAMES["cuda" if self.backend == "cpu" else "cpu"])
            self.sources[key] = data.decode(errors="replace") if data is not None else None
        return self.sources[key]

    def _result(self, card_id: str, node: Node) -> EvalResult | None:
        """A node's evaluator result (any schema version); a truncated or unparseable
        ``result.json`` reads as none (noted)."""
        raw = self._read(card_id, node, "result.json")
        if not raw:
            return None
        result = load_result(raw)
        if result is None:
            self._damage(Damage(short_ref(node_ref(card_id, node.id)),
                                f"{FOLDER}/result.json is not a readable result: read as no result",
                                node.commit, card_id, node.id, node.seq, skipped=False))
        return result

    def _view(self, card_id: str, node: Node, with_source: bool = False, with_result: bool = False) -> NodeView:
        result = None
        if with_result and node.id != ROOT and node.commit:
            key = (card_id, node.id)
            if key not in self.results:  # read from git once; contexts ask for the same nodes again
                self.results[key] = self._result(card_id, node)
            result = self.results[key]
        return NodeView(id=node.id, parent=node.parent, status=node.status, speedup=node.speedup, move=node.move,
                        reason=node.reason, source=self._source(card_id, node) if with_source else None,
                        result=result)

    def _context(self, card: Card, parent: Node) -> ProposalContext:
        tree = self.trees[card.id]
        nodes = sorted(tree.nodes.values(), key=lambda n: n.seq)
        best_so_far, improvements, regressions = 1.0, [], []
        for n in nodes:
            if n.id == ROOT or not n.ok or not n.speedup:
                continue
            if n.speedup > best_so_far:
                improvements.append(n)
                best_so_far = n.speedup
            par = tree.nodes.get(n.parent) if n.parent is not None else None
            if par is not None and par.speedup and n.speedup < par.speedup:
                regressions.append(n)
        children = [tree.nodes[c] for c in parent.children]
        best = tree.best()
        return ProposalContext(
            card=card, backend=self.backend,
            parent=self._view(card.id, parent, with_source=True, with_result=True),
            lineage=[self._view(card.id, n) for n in tree.lineage(parent.id)],
            best=self._view(card.id, best, with_source=True) if best is not None and best.id != ROOT else None,
            improvements=[self._view(card.id, n) for n in improvements[-3:]],
            regressions=[self._view(card.id, n) for n in regressions[-3:]],
            failed_siblings=[self._view(card.id, n, with_source=True, with_result=True) for n in children
                            if n.status not in EXPANDABLE_STATUSES],
            children=[self._view(card.id, n) for n in children],
            reference_source=(self._source(card.id, tree.root) or "") if tree.root is not None else "",
            tree_moves=[n.move for n in nodes],
            pool=self.pool, ledger=self.ledger, emit=self.bus.publish, seq=self.seq,
        )

    def _task(self, card: Card, ctx: ProposalContext) -> tuple[str, object, object]:
        try:
            proposal = self.proposer.propose(ctx)
        except ProposerFailure as exc:  # no child, but a conversation to keep
            return "proposer_failed", exc, None
        except Exception as exc:  # noqa: BLE001 - an LLM API that fails must not stop the search
            return "proposer_failed", f"{type(exc).__name__}: {exc}", None
        if proposal is None:
            return "exhausted", None, None
        try:
            result = self.pool.submit(card, proposal.source).result()
        except PoolLost as exc:  # not the candidate's fault: nothing recorded, the search stops
            return "pool_lost", exc, None
        except Exception as exc:  # noqa: BLE001 - the harness failed; record it against the node
            result = EvalResult(status="error", failure="harness", reason=f"{type(exc).__name__}: {exc}",
                                card=card.id, backend=self.backend)
        return "evaluated", proposal, result

    def _new_id(self, card_id: str) -> str:
        """The next free ``nNNNN``: not in the tree, not any branch name or id recorded for the card."""
        tree, taken = self.trees[card_id], self.taken.setdefault(card_id, set())
        i = len(tree.nodes)
        while f"n{i:04d}" in tree.nodes or f"n{i:04d}" in taken:
            i += 1
        taken.add(f"n{i:04d}")
        return f"n{i:04d}"

    def _record_result(self, card: Card, parent: Node, proposal: Proposal, result: EvalResult) -> str:
        """The new node's id."""
        for _ in range(19):
            try:
                return self._write_result(card, parent, proposal, result)
            except RefConflict as exc:  # a name load() could not see (a lock file left by kill -9): take another
                self._damage(Damage(short_ref(exc.ref), f"{exc}; the new node takes the next id", card=card.id,
                                    skipped=False))
        return self._write_result(card, parent, proposal, result)  # the twentieth: a conflict now is raised

    def _write_result(self, card: Card, parent: Node, proposal: Proposal, result: EvalResult) -> str:
        node_id = self._new_id(card.id)
        speedup = result.speedup_vs_eager if result.passed else None
        conversation = str(proposal.meta.get("conversation") or "")
        timed = result.passed and result.timing is not None
        rec = NodeRecord(self._next_seq(), card.id, node_id, parent.id, result.status, speedup,
                         proposal.move, str(proposal.proposer or getattr(self.proposer, "name", "?")), proposal.cost_usd,
                         result.reason, "", conversation,
                         time_us=result.time_us if timed else None,
                         eager_us=result.timing.eager.median if timed and result.timing is not None else None)
        files = {SOURCE_NAMES.get(self.backend, SOURCE_NAMES["cuda"]): proposal.source.encode(),
                 "result.json": result.to_json().encode(),
                 "node.json": json.dumps({"card": card.id, "node": node_id, "parent": parent.id, "move": proposal.move,
                                          "proposer": rec.proposer, "meta": proposal.meta,
                                          "cost_usd": proposal.cost_usd}, indent=1, default=str).encode()}
        if proposal.transcript is not None:
            files["transcript.json"] = json.dumps(proposal.transcript, indent=1, default=str).encode()
        if not proposal.charged:
            self.ledger.charge(card.id, proposal.cost_usd)
        self._commit_node(rec, files, parent.commit)
        self.sources[(card.id, node_id)] = proposal.source
        self.results[(card.id, node_id)] = result
        if conversation:
            self._conversations.add(conversation)
            self._forget_conversation(conversation)
        return node_id

    # ---- the agent's conversations ----------------------------------------------------------------
    def _forget_conversation(self, conversation: str) -> None:
        """Its record is committed: the proposer may drop its working files."""
        done = getattr(self.proposer, "recorded", None)
        if done is not None:
            done(conversation)

    def _failed(self, card: Card, parent: Node, failure: object) -> None:
        budget = self.budgets[card.id]
        if not isinstance(failure, ProposerFailure):
            budget.failures_in_row += 1
            self._log("proposer_failed", card.id, parent.id, reason=str(failure)[:500],
                      proposer=getattr(self.proposer, "name", "?"))
            return
        if failure.stopped:  # the proposer gave up for the run: not the card's fault
            self._recheck_support = True
        else:
            budget.failures_in_row += 1
        files = None
        if failure.transcript is not None:
            files = {"transcript.json": json.dumps(failure.transcript, indent=1, default=str).encode()}
        self._log("proposer_failed", card.id, parent.id, files=files, reason=str(failure)[:500],
                  proposer=failure.proposer or getattr(self.proposer, "name", "?"), cost_usd=failure.cost_usd,
                  conversation=failure.conversation or "", stopped=failure.stopped)
        if failure.conversation:
            self._conversations.add(failure.conversation)
            self._forget_conversation(failure.conversation)

    def _recover_conversations(self) -> None:
        """Record what conversations of an earlier run left behind when it was killed mid-way: the
        transcript on the log, the money spent in the ledger."""
        find = getattr(self.proposer, "interrupted", None)
        if find is None:
            return
        for item in find():
            conv = str(item["conversation"])
            if conv not in self._conversations:
                card = item.get("card") or None
                files = {"transcript.json": json.dumps(item["transcript"], indent=1, default=str).encode()}
                self._log("agent_interrupted", card, item.get("node") or None, files=files, conversation=conv,
                          cost_usd=float(item["cost_usd"]), queries=int(item.get("queries", 0)))
                self.ledger.charge(card or "", float(item["cost_usd"]))
                self._conversations.add(conv)
            self._forget_conversation(conv)

    # ---- the loop ---------------------------------------------------------------------------------
    def _limits(self, t_start: float) -> str | None:
        if self._stop_requested:
            return self._stop_requested
        if self.evals_total >= self.scfg.max_evals:
            return f"evaluation budget spent ({self.evals_total} of {self.scfg.max_evals})"
        if time.monotonic() - t_start >= self.scfg.max_wall_s:
            return f"wall-time budget spent ({self.scfg.max_wall_s:.0f} s)"
        if self.cost_total >= self.scfg.max_cost_usd > 0:
            return f"money budget spent (${self.cost_total:.2f} of ${self.scfg.max_cost_usd:.2f})"
        return None

    def _finish_card(self, b: CardBudget, reason: str) -> None:
        if b.finished is None:
            b.finished = reason
            self._log("card_finished", b.card.id, reason=reason, evals=b.evals, best_speedup=b.best_speedup)

    def _schedule(self, in_flight_cards: dict[str, int]) -> tuple[Card, Node] | None:
        if self._recheck_support:  # a proposer stopped: cards nothing else serves finish, saying why
            self._recheck_support = False
            for b in self.budgets.values():
                if b.finished is None and not in_flight_cards.get(b.card.id):
                    why = self.proposer.supports(b.card, self.backend)
                    if why:
                        self._finish_card(b, why)
        for b in self.budgets.values():
            b.in_flight = in_flight_cards.get(b.card.id, 0)
            if b.finished is None and b.in_flight == 0:
                reason = b.stop_reason(self.scfg)
                if reason:
                    self._finish_card(b, reason)
        tried: set[str] = set()
        while True:
            chosen = pick([x for x in self.budgets.values() if x.card.id not in tried])
            if chosen is None:
                return None
            b = chosen
            if b.evals + b.in_flight >= self.scfg.evals_per_card or \
                    b.failures_in_row >= self.scfg.proposer_failures:
                # a failing proposer gets no new calls; the card finishes once its last returns
                tried.add(b.card.id)
                continue
            node = select(self.trees[b.card.id], self.scfg.c_uct, self.scfg.widen_k, self.scfg.widen_alpha)
            if node is None:
                if b.in_flight == 0:
                    self._finish_card(b, NOTHING_MORE)
                tried.add(b.card.id)
                continue
            return b.card, node

    def run(self, *, resume: bool = False) -> SearchSummary:
        t_start = time.monotonic()
        with self.ws.git() as repo:
            self.store = SearchStore(repo)
            self._main_commit = repo.head("main")
            self._load(resume)
            started: dict[str, Any] = {"resumed": self.seq > 0, "cards": sorted(self.cards), "backend": self.backend,
                                       "proposer": getattr(self.proposer, "name", "?"), "skipped": self.skipped,
                                       "config": self.scfg.model_dump()}
            if self.damaged:
                started["damaged"] = [d.line for d in self.damaged[:100]]
            self._log("search_started", **started)
            for card in self.cards.values():
                self._ensure_root(card)
            self._recover_conversations()
            stopped = self._loop(t_start)
            try:
                self._log("search_stopped", reason=stopped, evaluations=self.evals_total, cost_usd=self.cost_total)
            except WorkspaceError as err:
                if self.git_failure is None:
                    self.git_failure = str(err)
                    stopped = f"git failed while recording the stop: {err}"
        best = {}
        for cid, tree in self.trees.items():
            n = tree.best()
            if n is not None:
                best[cid] = {"node": n.id, "speedup": n.speedup, "move": n.move}
        return SearchSummary(evaluations=self.evals_total, stopped=stopped, best=best, skipped=dict(self.skipped),
                             wall_s=time.monotonic() - t_start, git_s=self.git_s, cost_usd=self.cost_total,
                             finished={c: b.finished for c, b in self.budgets.items() if b.finished},
                             damaged=list(self.damaged), git_failure=self.git_failure,
                             pool_failure=self.pool_failure)

    RETIME = RETIME
    """A retimed node's move: ``retime <the node it times again>`` (``search.retime``)."""

    def retime(self) -> SearchSummary:
        """Each card's correct kernels that were timed while the machine was busy ("noisy": no
        speedup claimed, never offered for promotion), evaluated again, each once a call, as a child
        of the kernel's own node with the same source (move ``retime <node>``). A kernel that a
        retime has given a verdict (passed, rejected, crashed) is not timed again; one whose
        retimes all came back noisy is timed once more, not once for each of them
        (``search.retime.untimed``). Recorded like any search, so replay shows it."""
        t_start = time.monotonic()
        stopped = "every noisy kernel timed again"
        with self.ws.git() as repo:
            self.store = SearchStore(repo)
            self._main_commit = repo.head("main")
            self._load(resume=True)
            # every searched card the filter names, whatever the proposer or the budget would say
            cards = {c.id: c for c in self.ws.cards()
                     if not self.card_filter or any(id_matches(c.id, p) for p in self.card_filter)}
            todo = []
            for cid in sorted(set(cards) & set(self.trees)):
                tree = self.trees[cid]
                nodes = sorted(tree.nodes.values(), key=lambda n: n.seq)
                targets = untimed((n.id, n.status, n.move) for n in nodes)
                todo += [(cards[cid], tree.nodes[nid]) for nid in targets if (cid, nid) not in self._unreadable]
            self._log("search_started", resumed=True, cards=sorted({c.id for c, _ in todo}), backend=self.backend,
                      proposer="retime", skipped=self.skipped, config=self.scfg.model_dump(), retime=len(todo))
            for card, node in todo:
                if self._stop_requested:
                    stopped = self._stop_requested
                    break
                source = self._source(card.id, node)
                if source is None:
                    continue
                try:
                    result = self.pool.submit(card, source).result()
                except PoolLost as exc:  # nothing recorded for it: a later retime times it again
                    self.pool_failure = stopped = str(exc)
                    break
                except Exception as exc:  # noqa: BLE001 - the harness failed; recorded against the node
                    result = EvalResult(status="error", failure="harness", reason=f"{type(exc).__name__}: {exc}",
                                        card=card.id, backend=self.backend)
                if self._stop_requested and result.status in NO_VERDICT:
                    stopped = self._stop_requested
                    break  # stopped while it ran: nothing learnt, nothing recorded
                new = self._record_result(card, node, Proposal(source=source, move=self.RETIME + node.id,
                                                               proposer="retime"), result)
                self.retimed.append((card.id, node.id, self.trees[card.id].nodes[new]))
            self._log("search_stopped", reason=stopped, evaluations=self.evals_total, cost_usd=self.cost_total)
        best = {cid: {"node": n.id, "speedup": n.speedup, "move": n.move}
                for cid, tree in self.trees.items() if (n := tree.best()) is not None}
        return SearchSummary(evaluations=len(self.retimed), stopped=stopped, best=best, skipped=dict(self.skipped),
                             wall_s=time.monotonic() - t_start, git_s=self.git_s, cost_usd=self.cost_total,
                             damaged=list(self.damaged), pool_failure=self.pool_failure)

    def retime_lines(self) -> list[str]:
        """What ``retime`` did, a line a kernel timed again (or why nothing was)."""
        out = []
        for card, parent, node in self.retimed:
            timed = f"{node.speedup:.3f}x eager" if node.status == "passed" and node.speedup else node.status
            why = f" ({node.reason})" if node.status != "passed" and node.reason else ""
            out.append(f"retimed {card} {parent}: {node.id} {timed}{why}")
        return out or ["no kernel to time again: no correct kernel was timed while the machine was busy"]

    def _loop(self, t_start: float) -> str:
        in_flight: dict[Future, tuple[Card, Node]] = {}
        per_card: dict[str, int] = {}
        stopped = ""
        with ThreadPoolExecutor(max_workers=self.scfg.parallel, thread_name_prefix="forge-search") as ex:
            while True:
                limit = self._limits(t_start)
                while limit is None and len(in_flight) < self.scfg.parallel and \
                        self.evals_total + len(in_flight) < self.scfg.max_evals:
                    picked = self._schedule(per_card)
                    if picked is None:
                        break
                    card, parent = picked
                    ctx = self._context(card, parent)
                    if (card.id, parent.id) in self._unreadable:
                        parent.expandable = False  # its files cannot be read: nothing to build a child on
                        continue
                    tree = self.trees[card.id]
                    parent.pending += 1
                    tree.add_virtual(parent.id, +1)
                    per_card[card.id] = per_card.get(card.id, 0) + 1
                    self.bus.publish(NodeStarted(seq=self.seq, card=card.id, node=parent.id,
                                                 in_flight=len(in_flight) + 1))
                    in_flight[ex.submit(self._task, card, ctx)] = (card, parent)
                if not in_flight:
                    stopped = limit or "every card is finished"
                    break
                done, _ = wait(list(in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
                for fut in done:
                    card, parent = in_flight.pop(fut)
                    per_card[card.id] -= 1
                    parent.pending -= 1
                    self.trees[card.id].add_virtual(parent.id, -1)
                    kind, a, b = fut.result()
                    budget = self.budgets[card.id]
                    try:
                        if kind == "evaluated":
                            budget.failures_in_row = 0
                            self._record_result(card, parent, a, b)
                        elif kind == "exhausted":
                            parent.expandable = False
                        elif kind == "pool_lost":
                            self.pool_failure = self.pool_failure or str(a)
                            self.request_stop(self.pool_failure)
                        else:
                            self._failed(card, parent, a)
                    except WorkspaceError as err:
                        # git failed (disk full, a damaged object store, permissions): stop with
                        # every node finished so far kept; the evaluations in flight are lost
                        self.git_failure = str(err)
                        self.request_stop(f"git failed, the search stopped: {err}")
                    self.bus.publish(BudgetSpent(seq=self.seq, evaluations=self.evals_total,
                                                 max_evals=self.scfg.max_evals, cost_usd=self.cost_total,
                                                 wall_s=time.monotonic() - t_start, git_s=self.git_s))
                if limit is not None and not in_flight:
                    stopped = limit
                    break
        return stopped

    # ---- promotion (the TUI's approval) ---------------------------------------------------------
    def request_promotion(self, card_id: str, node_id: str) -> None:
        """Record that the user approved a node for promotion (only while the search runs; the
        loop's thread owns git)."""
        if self.store is None:
            raise ForgeError("promotion requests are recorded while the search runs")
        self._log("promotion_requested", card_id, node_id)
