"""The events the search emits, typed: one class per kind. The core imports no Textual; the app
turns each event into a Textual message (``forge_tui/ui``), the CLI prints ``event.line()``.

Persistent events are facts recorded in git: ``forge replay`` rebuilds exactly the same objects,
in the same order, from the history (``history.py``). Transient ones (``NodeStarted``,
``BudgetSpent``, ``StoreDamaged``) report progress and are not replayed.
"""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut at a word with an ellipsis where longer than ``width``, and before
    any parenthesis the cut would leave open (the node's whole reason is in its result, and in
    the app's tree)."""
    line = " ".join(text.split())
    if len(line) <= width:
        return line
    cut = line[: width - 1].rsplit(" ", 1)[0] if " " in line[: width - 1] else line[: width - 1]
    while cut.count("(") > cut.count(")"):
        cut = cut[: cut.rfind("(")]
    return cut.rstrip(" ,;:(") + " …"


class SearchEvent(BaseModel):
    """What every event carries: its kind, the search's sequence number, and the card and node it
    concerns (None where it concerns the whole search)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")
    persistent: ClassVar[bool] = True

    kind: str
    seq: int
    card: str | None = None
    node: str | None = None

    @property
    def data(self) -> dict[str, Any]:
        """The kind's own fields (everything but kind, seq, card and node): what git records."""
        return self.model_dump(exclude={"kind", "seq", "card", "node"})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.model_dump_json())
        return out

    def line(self) -> str:
        return f"[{self.seq:5d}] {self.kind} {self.card or ''} {self.node or ''}".rstrip()


class SearchStarted(SearchEvent):
    kind: Literal["search_started"] = "search_started"
    resumed: bool = False
    cards: list[str] = Field(default_factory=list)
    backend: str = ""
    proposer: str = ""
    skipped: dict[str, str] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    damaged: list[str] = Field(default_factory=list)

    def line(self) -> str:
        return (f"[{self.seq:5d}] search {'resumed' if self.resumed else 'started'}: {len(self.cards)} cards, "
                f"proposer {self.proposer}, backend {self.backend}")


class NodeAdded(SearchEvent):
    kind: Literal["node_added"] = "node_added"
    parent: str | None = None
    status: str = ""
    speedup: float | None = None
    move: str = ""
    proposer: str = ""
    reason: str = ""
    cost_usd: float = 0.0
    time_us: float | None = None
    """The kernel's own time and eager's in its evaluation (µs; None where not recorded): what
    ranks a card's kernels (``tree.pooled_speedups``), beside the paired ``speedup``."""
    eager_us: float | None = None

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def line(self) -> str:
        head = f"[{self.seq:5d}] {self.card} {self.node}"
        if self.is_root:
            return f"{head} root: eager reference (1.000x)"
        sp = f"{self.speedup:.3f}x" if self.speedup else "-"
        if self.time_us and self.status in ("passed", "noisy"):
            sp += f" ({self.time_us:.1f} µs)"
        why = f"  ({shorten(self.reason, 100)})" if self.status != "passed" and self.reason else ""
        return f"{head} <- {self.parent}: {self.status} {sp}  {self.move}{why}"


class BestImproved(SearchEvent):
    kind: Literal["best_improved"] = "best_improved"
    speedup: float
    previous: float

    def line(self) -> str:
        return f"[{self.seq:5d}] {self.card} best improved: {self.node} {self.speedup:.3f}x (was {self.previous:.3f}x)"


class BestLost(SearchEvent):
    """The card's best (``node``) no longer beats eager: a later evaluation moved eager's median
    over the card, and no other kernel beats it either. The card has no best until one does."""

    kind: Literal["best_lost"] = "best_lost"
    speedup: float | None = None
    previous: float = 1.0

    def line(self) -> str:
        now = f"now {self.speedup:.3f}x against eager pooled over the card" if self.speedup else "no longer timed"
        return (f"[{self.seq:5d}] {self.card} best lost: {self.node} {now} (was {self.previous:.3f}x); "
                "nothing on this card beats eager")


class CardFinished(SearchEvent):
    kind: Literal["card_finished"] = "card_finished"
    reason: str = "finished"
    evals: int = 0
    best_speedup: float | None = None

    def line(self) -> str:
        return f"[{self.seq:5d}] {self.card} finished: {self.reason}"


class ProposerFailed(SearchEvent):
    kind: Literal["proposer_failed"] = "proposer_failed"
    reason: str = ""
    proposer: str = ""
    cost_usd: float = 0.0
    """What the failed expansion spent (an LLM conversation that ended without a child)."""
    conversation: str = ""
    stopped: bool = False
    """The proposer stopped for the run (the search goes on with the others)."""

    def line(self) -> str:
        cost = f" (${self.cost_usd:.4f})" if self.cost_usd else ""
        return f"[{self.seq:5d}] {self.card} proposer {self.proposer or ''} failed at {self.node}{cost}: {self.reason}"


class AgentInterrupted(SearchEvent):
    """A conversation that an earlier run left unfinished (killed mid-conversation): its transcript
    is kept on the log and its spending counted."""

    kind: Literal["agent_interrupted"] = "agent_interrupted"
    conversation: str = ""
    cost_usd: float = 0.0
    queries: int = 0

    def line(self) -> str:
        return (f"[{self.seq:5d}] {self.card} conversation {self.conversation} at {self.node} was interrupted "
                f"({self.queries} queries, ${self.cost_usd:.4f}); its transcript is kept")


class AgentStep(SearchEvent):
    """One query of an agent's conversation and the tools it called: tokens and money per call,
    and the running totals of the conversation, the card and the run."""

    persistent: ClassVar[bool] = False
    kind: Literal["agent_step"] = "agent_step"
    conversation: str = ""
    step: int = 0
    tools: list[str] = Field(default_factory=list)
    summary: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0
    conversation_cost_usd: float = 0.0
    card_cost_usd: float = 0.0
    run_cost_usd: float = 0.0

    def line(self) -> str:
        return (f"[{self.seq:5d}] {self.card} agent {self.conversation} step {self.step}: {self.summary[:120]} "
                f"[{self.input_tokens}+{self.output_tokens} tok, ${self.cost_usd:.4f}; conversation "
                f"${self.conversation_cost_usd:.4f}, card ${self.card_cost_usd:.4f}, run ${self.run_cost_usd:.4f}]")


class PromotionRequested(SearchEvent):
    kind: Literal["promotion_requested"] = "promotion_requested"

    def line(self) -> str:
        return f"[{self.seq:5d}] {self.card} promotion requested: {self.node}"


class SearchStopped(SearchEvent):
    kind: Literal["search_stopped"] = "search_stopped"
    reason: str = ""
    evaluations: int = 0
    cost_usd: float = 0.0

    def line(self) -> str:
        return f"[{self.seq:5d}] search stopped: {self.reason} ({self.evaluations} evaluations)"


class NodeStarted(SearchEvent):
    persistent: ClassVar[bool] = False
    kind: Literal["node_started"] = "node_started"
    in_flight: int = 0


class BudgetSpent(SearchEvent):
    persistent: ClassVar[bool] = False
    kind: Literal["budget_spent"] = "budget_spent"
    evaluations: int = 0
    max_evals: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    git_s: float = 0.0


class StoreDamaged(SearchEvent):
    """A recorded item the search skipped (or read in part); see ``store.Damage``."""

    persistent: ClassVar[bool] = False
    kind: Literal["store_damaged"] = "store_damaged"
    ref: str
    what: str
    commit: str | None = None
    skipped: bool = True
    text: str = ""

    def line(self) -> str:
        return self.text or f"{'skipped' if self.skipped else 'damaged'} {self.ref}: {self.what}"


class OtherEvent(SearchEvent):
    """A log entry of a kind this version does not know (written by a newer one): kept, not lost."""

    model_config = ConfigDict(frozen=True, extra="allow")


Event = Annotated[Union[SearchStarted, NodeAdded, BestImproved, BestLost, CardFinished, ProposerFailed, PromotionRequested,
                        SearchStopped, NodeStarted, BudgetSpent, StoreDamaged, AgentInterrupted, AgentStep],
                  Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)
KINDS = {cls.model_fields["kind"].default: cls for cls in
         (SearchStarted, NodeAdded, BestImproved, BestLost, CardFinished, ProposerFailed, PromotionRequested, SearchStopped,
          NodeStarted, BudgetSpent, StoreDamaged, AgentInterrupted, AgentStep)}
PERSISTENT = tuple(k for k, cls in KINDS.items() if cls.persistent)
TRANSIENT = tuple(k for k, cls in KINDS.items() if not cls.persistent)


def make_event(kind: str, seq: int, card: str | None = None, node: str | None = None,
               data: dict[str, Any] | None = None) -> SearchEvent:
    """The typed event for a kind and its recorded data; an unknown kind, or data this version
    cannot read, becomes an ``OtherEvent`` that keeps everything."""
    body = {"kind": kind, "seq": seq, "card": card, "node": node, **(data or {})}
    if kind in KINDS:
        try:
            return _ADAPTER.validate_python(body)  # type: ignore[no-any-return]
        except ValidationError:
            pass
    return OtherEvent(**body)


class EventBus:
    """Synchronous fan-out; subscribers must be quick (the TUI posts a message and returns)."""

    def __init__(self) -> None:
        self._subs: list[Callable[[SearchEvent], object]] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[SearchEvent], object]) -> Callable[[], None]:
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    def publish(self, event: SearchEvent) -> None:
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(event)


class Recorder:
    """A subscriber that keeps every event (tests, the CLI's summary)."""

    def __init__(self) -> None:
        self.events: list[SearchEvent] = []

    def __call__(self, event: SearchEvent) -> None:
        self.events.append(event)

    def persistent(self) -> list[SearchEvent]:
        return [e for e in self.events if e.persistent]
