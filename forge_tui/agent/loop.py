"""The agent's loop: query the model, run the tools it calls, append what they said, repeat until
it submits or a limit ends the conversation.

The shape is mini-swe-agent's: ``run`` calls ``step`` until done; ``step`` checks the limits,
makes one query and executes its tool calls. Whatever the model gets wrong (no tool call, an
unknown tool, arguments that do not validate, a tool's refusal) goes back to it as a message; only
the provider failing or a limit ends the run early, and both end it cleanly with the reason.

Limits are checked before every query and are never passed: the tool calls, the tokens and the
money of the conversation, the wall time, and (through the ledger) the money of the card and of the
run. A query's tokens are bounded before it is sent: its input by the UTF-8 size of everything sent
(no tokenizer makes more tokens than bytes) plus a margin for the provider's framing, its output by
the ``max_tokens`` the query is given, which shrinks as a limit comes near.

Every tool result passes through ``redact`` before it is kept or sent: the values of the
environment's secrets and key-shaped text never reach the model, whatever a tool printed
(a compiler's diagnostics, a reference's output).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..redaction import redact as redact_environment
from ..search.ledger import Ledger, LimitReached
from .messages import Message, ModelTurn, Provider, ProviderError, ToolResult, ToolResultsMessage, ToolSpec, Usage, UserMessage
from .pricing import Price
from .transcript import Transcript

FRAMING_TOKENS = 2000
"""Tokens a provider may add to a query beyond what we send (tool-use system prompt, roles)."""
PER_MESSAGE_TOKENS = 16
MIN_OUTPUT_TOKENS = 512
"""A query is not worth making with less room to answer than this."""
NO_TOOL_NUDGE = ("You did not call a tool. Work only through the tools; when the kernel is ready, "
                 "call submit.")
MAX_NUDGES = 3


@dataclass(frozen=True)
class Limits:
    tool_calls: int = 40
    tokens: int = 600_000
    wall_s: float = 1200.0
    cost_usd: float = 2.0
    output_tokens: int = 8192


@dataclass
class Outcome:
    """How a conversation ended."""

    submitted: bool
    reason: str
    """"submitted", or why it stopped (a limit, the provider, the model not using tools)."""
    provider_failed: bool = False
    provider_status: int | None = None
    """The HTTP status of the provider's failure, when it gave one."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    queries: int = 0
    tool_calls: int = 0
    wall_s: float = 0.0


class Stop(Exception):
    """Ends the conversation (a limit, the provider); the message says why."""

    def __init__(self, reason: str, provider_failed: bool = False, status: int | None = None) -> None:
        super().__init__(reason)
        self.provider_failed = provider_failed
        self.status = status


def input_bound(system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    """At most how many input tokens a query of these can take."""
    body = len(system.encode()) + sum(len(json.dumps(t.model_dump()).encode()) for t in tools)
    body += sum(len(m.model_dump_json().encode()) + PER_MESSAGE_TOKENS for m in messages)
    return body + FRAMING_TOKENS


class Agent:
    """One conversation. ``execute`` runs a tool call and returns its result (never raises);
    ``submitted`` says whether the model has submitted; ``on_step`` is told after every step (the
    events: the query's tokens and cost, the tools called, the first line of each result);
    ``redact`` hides secrets in every tool result (default: the environment's and key shapes)."""

    def __init__(self, provider: Provider, price: Price, tools: Sequence[ToolSpec],
                 execute: Callable[[Any], ToolResult], submitted: Callable[[], bool], *, limits: Limits,
                 ledger: Ledger, card: str, transcript: Transcript,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 redact: Callable[[str], str] = redact_environment) -> None:
        self.provider = provider
        self.price = price
        self.tools = list(tools)
        self.execute = execute
        self.submitted = submitted
        self.limits = limits
        self.ledger = ledger
        self.card = card
        self.transcript = transcript
        self.on_step = on_step
        self.redact = redact
        self.last_cost = 0.0
        self._summary = ""
        self.clock = clock
        self.system = ""
        self.messages: list[Message] = []
        self.usage = Usage()
        self.cost = 0.0
        self.queries = 0
        self.tool_calls = 0
        self.nudges = 0
        self.t0 = clock()

    # ---- limits --------------------------------------------------------------------------------
    def _allowance(self) -> tuple[int, int]:
        """(input bound, output tokens) of the next query, or Stop naming the limit in the way."""
        lim = self.limits
        if self.tool_calls >= lim.tool_calls:
            raise Stop(f"tool-call limit reached ({self.tool_calls} of {lim.tool_calls})")
        elapsed = self.clock() - self.t0
        if elapsed >= lim.wall_s:
            raise Stop(f"wall-time limit reached ({elapsed:.0f} s of {lim.wall_s:.0f} s)")
        n_in = input_bound(self.system, self.messages, self.tools)
        out = min(lim.output_tokens, lim.tokens - self.usage.total - n_in)
        if out < MIN_OUTPUT_TOKENS:
            raise Stop(f"token limit reached ({self.usage.total} used of {lim.tokens}; the next query needs up to "
                       f"{n_in + MIN_OUTPUT_TOKENS})")
        if self.price.output > 0 or self.price.input > 0:
            room = min(lim.cost_usd - self.cost, self.ledger.headroom(self.card))
            in_cost = self.price.worst_case(n_in, 0)
            if self.price.output > 0:
                out = min(out, int((room - in_cost) * 1e6 / self.price.output))
            if out < MIN_OUTPUT_TOKENS or in_cost > room:
                why = self.ledger.why_not(self.card, self.price.worst_case(n_in, MIN_OUTPUT_TOKENS))
                if why is None:
                    why = (f"the conversation's money cap (${lim.cost_usd:.2f}): ${self.cost:.4f} spent, the next "
                           f"query may cost ${self.price.worst_case(n_in, MIN_OUTPUT_TOKENS):.4f}")
                raise Stop(f"money limit reached: {why}")
        return n_in, out

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, system: str, task: str) -> Outcome:
        self.system = system
        self.messages = [UserMessage(text=task)]
        self.transcript.add("message", step=0, message=self.messages[0].model_dump())
        reason, failed, status = "submitted", False, None
        try:
            while not self.submitted():
                self.step()
        except Stop as stop:
            reason, failed, status = str(stop), stop.provider_failed, stop.status
        out = Outcome(submitted=self.submitted(), reason=reason if not self.submitted() else "submitted",
                      provider_failed=failed, provider_status=status, usage=self.usage, cost_usd=self.cost, queries=self.queries,
                      tool_calls=self.tool_calls, wall_s=self.clock() - self.t0)
        self.transcript.add("end", reason=out.reason, submitted=out.submitted, provider_failed=failed,
                            cost_usd=round(self.cost, 6), usage=self.usage.model_dump(), queries=self.queries,
                            tool_calls=self.tool_calls, wall_s=round(out.wall_s, 3))
        return out

    def step(self) -> None:
        turn = self.query()
        try:
            self._act(turn)
        finally:
            if self.on_step is not None:
                self.on_step({"step": self.queries, "usage": turn.usage, "cost_usd": self.last_cost,
                              "tools": [c.name for c in turn.message.tool_calls], "summary": self._summary})

    def _act(self, turn: ModelTurn) -> None:
        msg = turn.message
        self._summary = "no tool called"
        self.messages.append(msg)
        self.transcript.add("message", step=self.queries, message=msg.model_dump())
        if not msg.tool_calls:
            self.nudges += 1
            if self.nudges > MAX_NUDGES:
                raise Stop(f"the model answered {self.nudges} times without calling a tool")
            note = NO_TOOL_NUDGE
            if turn.stop_reason in ("max_tokens", "length"):
                note = "Your answer was cut at the output-token limit. Keep answers short; " + NO_TOOL_NUDGE
            self.messages.append(UserMessage(text=note))
            self.transcript.add("message", step=self.queries, message=self.messages[-1].model_dump())
            return
        self.nudges = 0
        results = []
        for call in msg.tool_calls:
            if self.tool_calls >= self.limits.tool_calls:
                results.append(ToolResult(call_id=call.id, name=call.name, is_error=True,
                                          content="not run: the conversation's tool-call limit is reached"))
                continue
            self.tool_calls += 1
            t0 = self.clock()
            result = self.execute(call)
            result = result.model_copy(update={"content": self.redact(result.content)})
            results.append(result)
            self.transcript.add("tool", step=self.queries, name=call.name, call_id=call.id,
                                is_error=result.is_error, seconds=round(self.clock() - t0, 3))
        left = self.limits.tool_calls - self.tool_calls
        note = ""
        if not self.submitted() and left <= 3:
            note = f"{left} tool call{'s' if left != 1 else ''} left in this conversation: submit your best kernel soon."
        self.messages.append(ToolResultsMessage(results=results, text=note))
        self.transcript.add("message", step=self.queries, message=self.messages[-1].model_dump())
        self._summary = "; ".join(f"{r.name}: {_first_line(r.content)}" for r in results)[:300]

    def query(self) -> ModelTurn:
        n_in, out = self._allowance()
        worst = self.price.worst_case(n_in, out)
        try:
            res = self.ledger.reserve(self.card, worst)
        except LimitReached as exc:
            raise Stop(f"money limit reached: {exc}") from None
        t0 = self.clock()
        try:
            turn = self.provider.query(self.system, self.messages, self.tools, out)
        except ProviderError as exc:
            self.ledger.settle(res, 0.0)
            self.transcript.add("query_failed", step=self.queries + 1, error=str(exc), retryable=exc.retryable,
                                status=exc.status)
            raise Stop(f"the provider failed: {exc}", provider_failed=True, status=exc.status) from None
        except Exception as exc:  # noqa: BLE001 - a provider bug must end the conversation, not the search
            self.ledger.settle(res, 0.0)
            self.transcript.add("query_failed", step=self.queries + 1, error=f"{type(exc).__name__}: {exc}")
            raise Stop(f"the provider failed: {type(exc).__name__}: {exc}", provider_failed=True) from None
        cost = self.price.cost(turn.usage)
        self.ledger.settle(res, cost)
        self.queries += 1
        self.usage = self.usage + turn.usage
        self.cost += cost
        self.transcript.add("query", step=self.queries, model=turn.model or self.provider.model,
                            stop_reason=turn.stop_reason, usage=turn.usage.model_dump(), cost_usd=round(cost, 6),
                            max_tokens=out, input_bound=n_in, reserved_usd=round(worst, 6),
                            seconds=round(self.clock() - t0, 3), request_id=turn.request_id)
        self.last_cost = cost
        return turn


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:120]


__all__ = ["Agent", "Limits", "Outcome", "Stop", "input_bound"]
