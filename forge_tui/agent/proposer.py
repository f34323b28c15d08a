"""AgentProposer: the LLM agent as a proposer. Each expansion of a node is one tool-using
conversation, in a working directory of its own, that ends when the model submits a kernel (or a
limit ends it); the search then evaluates the kernel in full, as for any proposer.

A conversation that ends without a submission but with a draft that differs from its parent gives
that draft (the harness judges it like any child); one that ends with nothing raises
``ProposerFailure`` carrying its transcript and cost, which the search records. A provider that
keeps failing (``[agent] failures`` conversations in a row, or at once when it refuses the key or
the model) stops the agent for the run with the reason; the search goes on without it.

The working directory (``<workspace>/.forge/agent/<conversation>/``) holds the transcript, written
after every step; the search removes it once the child (or the failure) is committed, and commits
what an interrupted run left behind when the next run starts (``interrupted``).
"""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import safeio
from ..cards import Card
from ..config import ForgeConfig
from ..kernel_abi import SOURCE_NAMES
from ..redaction import redact as redact_environment
from ..search.ledger import Ledger
from ..search.proposer import Proposal, ProposalContext, ProposerFailure
from .context import EXT, LANGUAGE, card_summary, lineage_summary, machine_summary, prepare_workdir, prompt_text, render
from .loop import Agent, Limits, Outcome
from .messages import Provider
from .pricing import Price
from .transcript import NAME, Transcript, cost_of, read_entries

if TYPE_CHECKING:
    from ..kernels.device import DeviceProps
    from ..templates.proposer import TemplateProposer

MAX_DRAFT_BYTES = 1 << 20
"""A draft larger than this is not a kernel the harness takes."""
FATAL_STATUSES = (401, 403, 404)
"""Provider answers that no retry will change (a bad key, no access, no such model)."""


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:60]


def read_draft(workdir: Path, name: str) -> tuple[str, str]:
    """(the draft the conversation left in ``workdir/name``, "") or ("", why it was not read): read
    through ``safeio``, so a link planted there is refused, never followed; a missing draft is
    simply none."""
    try:
        return safeio.read_text(workdir, name, limit=MAX_DRAFT_BYTES, strict=False)[1], ""
    except safeio.Missing:
        return "", ""
    except safeio.Refused as exc:
        return "", str(exc)


class AgentProposer:
    name = "agent"

    def __init__(self, config: ForgeConfig, provider: Provider, price: Price, *, workdir_root: Path,
                 profile: dict[str, Any] | None = None, gpu: "DeviceProps | None" = None,
                 template: "TemplateProposer | None" = None, redact: Callable[[str], str] = redact_environment) -> None:
        self.config = config
        self.acfg = config.agent
        self.provider = provider
        self.price = price
        self.root = Path(workdir_root)
        self.profile = profile or {}
        self.gpu = gpu
        self.template = template
        self.redact = redact
        self.stopped: str | None = None
        """Why the agent makes no more calls this run (None while it does)."""
        self.failures_in_row = 0
        self.cards_stopped: dict[str, str] = {}
        """Cards the agent makes no more calls for (their money cap is reached), and why."""
        self._lock = threading.Lock()

    @property
    def limits(self) -> Limits:
        a = self.acfg
        return Limits(tool_calls=a.max_tool_calls, tokens=a.max_tokens, wall_s=a.max_wall_s, cost_usd=a.max_cost_usd,
                      output_tokens=a.max_output_tokens)

    def describe(self) -> str:
        return f"{self.provider.name} {self.provider.model}"

    # ---- the Proposer protocol -------------------------------------------------------------------
    def supports(self, card: Card, backend: str) -> str | None:
        if self.stopped:
            return f"the LLM agent stopped: {self.stopped}"
        if card.id in self.cards_stopped:
            return f"the LLM agent stopped on this card: {self.cards_stopped[card.id]}"
        if backend not in EXT:
            return f"the agent writes no kernels for the {backend} backend"
        return None

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        if self.supports(ctx.card, ctx.backend) is not None:
            return None
        conv = f"{_safe(ctx.card.id)}.{ctx.parent.id}.{uuid.uuid4().hex[:8]}"
        workdir = self.root / conv
        source_name = SOURCE_NAMES[ctx.backend]
        template_source = None
        if self.template is not None:
            try:
                template_source = self.template.first_kernel(ctx.card, ctx.backend)
            except Exception:  # noqa: BLE001 - a starting point is a courtesy, never a reason to fail
                template_source = None
        prep = prepare_workdir(workdir, ctx, template_source)
        transcript = Transcript(workdir / NAME, self.redact)
        ledger = ctx.ledger if isinstance(ctx.ledger, Ledger) else Ledger(0.0)
        limits = self.limits
        transcript.add("start", conversation=conv, card=ctx.card.id, parent=ctx.parent.id, backend=ctx.backend,
                       provider=self.provider.name, model=self.provider.model, limits=limits.__dict__,
                       price=self.price.model_dump())
        system = render("system.md", source_name=source_name, language=LANGUAGE[ctx.backend], ext=EXT[ctx.backend],
                        rules=prompt_text("rules.md").strip(),
                        limits=(f"{limits.tool_calls} tool calls, {limits.tokens} tokens, {limits.wall_s:.0f} s and "
                                f"${limits.cost_usd:.2f} for this conversation"))
        task = render("task.md", card_id=ctx.card.id, card_summary=card_summary(ctx.card),
                      reference=ctx.reference_source.strip(), machine=machine_summary(ctx.backend, self.profile, self.gpu),
                      lineage=lineage_summary(ctx), parent_section=prep.parent_section,
                      siblings_section=prep.siblings_section, template_section=prep.template_section,
                      files="\n".join(f"- {f}{' (read-only)' if f in prep.read_only else ''}" for f in prep.files),
                      source_name=source_name)
        transcript.add("system", text=system)
        from agent_tools import ToolEnv, kernel_tools, run_tool

        ecfg = self.config.evaluator
        env = ToolEnv(workdir=workdir, card=ctx.card, backend=ctx.backend, pool=ctx.pool, source_name=source_name,
                      read_only=set(prep.read_only),
                      timeout_s=ecfg.build_timeout_s + 6 * ecfg.run_timeout_s)
        tools = {t.name: t for t in kernel_tools()}

        def on_step(info: dict[str, Any]) -> None:
            if ctx.emit is None:
                return
            from ..search.events import AgentStep

            u = info["usage"]
            ctx.emit(AgentStep(seq=ctx.seq, card=ctx.card.id, node=ctx.parent.id, conversation=conv,
                               step=info["step"], tools=info["tools"], summary=self.redact(info["summary"]),
                               input_tokens=u.input_tokens, output_tokens=u.output_tokens,
                               cache_read_tokens=u.cache_read_tokens, cost_usd=info["cost_usd"],
                               conversation_cost_usd=agent.cost, card_cost_usd=ledger.spent_on(ctx.card.id),
                               run_cost_usd=ledger.spent))

        agent = Agent(self.provider, self.price, [t.spec() for t in tools.values()],
                      execute=lambda call: run_tool(tools, env, call), submitted=lambda: env.submission is not None,
                      limits=limits, ledger=ledger, card=ctx.card.id, transcript=transcript, on_step=on_step,
                      redact=self.redact)
        out = agent.run(system, task)
        self._count(out, ctx.card.id)
        meta = {"conversation": conv, "provider": self.provider.name, "model": self.provider.model,
                "queries": out.queries, "tool_calls": out.tool_calls, "usage": out.usage.model_dump(),
                "ended": out.reason, "wall_s": round(out.wall_s, 2)}
        if env.submission is not None:
            return Proposal(source=env.submission.source, move=f"agent: {env.submission.move}", meta=meta,
                            transcript=transcript.entries, cost_usd=out.cost_usd, proposer=self.name,
                            charged=True)
        draft, refused = read_draft(workdir, source_name)
        if draft.strip() and (ctx.parent.id == "root" or draft != (ctx.parent.source or "")):
            meta["submitted"] = False
            return Proposal(source=draft, move=f"agent draft, not submitted ({out.reason[:80]})", meta=meta,
                            transcript=transcript.entries, cost_usd=out.cost_usd, proposer=self.name,
                            charged=True)
        reason = f"the agent ended without a kernel: {out.reason}"
        if refused:
            reason += f"; its draft was not read: {refused}"
        stopped = self.supports(ctx.card, ctx.backend)
        if stopped is not None and not stopped.endswith(out.reason):
            reason += f"; {stopped}"
        raise ProposerFailure(reason, transcript=transcript.entries, cost_usd=out.cost_usd, proposer=self.name,
                              conversation=conv, stopped=stopped is not None)

    def _count(self, out: Outcome, card: str) -> None:
        with self._lock:
            if out.queries == 0 and out.reason.startswith("money limit"):
                # not even one query fits: nothing changes that until the next run (or ever, for the card)
                if "card's money cap" in out.reason:
                    self.cards_stopped[card] = out.reason
                else:
                    self.stopped = out.reason
            if not out.provider_failed:
                self.failures_in_row = 0
                return
            self.failures_in_row += 1
            if out.provider_status in FATAL_STATUSES:
                self.stopped = f"the provider refused the request ({out.reason}); the search goes on without the agent"
            elif self.failures_in_row >= self.acfg.failures:
                self.stopped = (f"{self.failures_in_row} conversations in a row failed at the provider, the last: "
                                f"{out.reason}; the search goes on without the agent")

    # ---- working directories ---------------------------------------------------------------------
    def recorded(self, conversation: str) -> None:
        """The search committed the conversation's record: its working directory can go."""
        if conversation and "/" not in conversation and conversation not in (".", ".."):
            shutil.rmtree(self.root / conversation, ignore_errors=True)

    def interrupted(self) -> list[dict[str, Any]]:
        """Conversations an earlier run left unfinished: card, node, conversation, transcript, cost."""
        out: list[dict[str, Any]] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if not d.is_dir() or d.is_symlink():
                continue
            entries = read_entries(d / NAME)
            start = next((e for e in entries if e.get("type") == "start"), {})
            out.append({"conversation": d.name, "card": start.get("card"), "node": start.get("parent"),
                        "transcript": entries, "cost_usd": cost_of(entries),
                        "queries": sum(1 for e in entries if e.get("type") == "query")})
        return out
