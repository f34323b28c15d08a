"""One composition point for the CLI and the app: a workspace, its configuration, and what works
on it (the proposer, the evaluation pool, the search), built the same way for both.

    session = Session.open("workspaces/demo")
    with session.search(proposer="auto", bus=bus) as search:
        summary = search.run(resume=True)   # continue what is recorded, else start
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .config import ForgeConfig, discover_config
from .errors import ForgeError

if TYPE_CHECKING:
    from .agent.proposer import AgentProposer
    from .evaluator import Evaluator
    from .profiler.run import ProfileResult
    from .search.events import EventBus
    from .search.pool import EvalPool
    from .search.proposer import Proposer
    from .search.runner import Search
    from .templates.proposer import TemplateProposer
    from .workspace import Workspace

PROPOSERS = ("auto", "agent", "templates", "scripted:PLAN.json")


@dataclass
class ProposerChoice:
    """The proposer a session built, and why that one (shown to the user)."""

    proposer: "Proposer"
    why: str


@dataclass
class Session:
    workspace: "Workspace"
    config: ForgeConfig
    config_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, workspace: Path | str, config: Path | None = None) -> "Session":
        """An existing workspace, with the configuration found for it (``--config``, ./forge.toml,
        the workspace's own)."""
        from .workspace import Workspace

        ws = Workspace.open(Path(workspace))
        cfg, path = discover_config(config, ws.root)
        return cls(ws, cfg, path)

    @classmethod
    def profile(cls, workload: str, workspace: Path | str, *, device: str | None = None, dtype: str | None = None,
                config: Path | None = None, progress: Callable[[str], None] = lambda msg: None,
                generate: int | None = None) -> tuple["Session", "ProfileResult"]:
        """Profile a workload (``generate``: a generation of that many new tokens) into a new
        workspace (written only once everything succeeded)."""
        from .workspace import profile_into_workspace

        ws, result = profile_into_workspace(workload, workspace, device=device, dtype=dtype, config_path=config,
                                            progress=progress, generate=generate)
        cfg, path = discover_config(config, ws.root)
        return cls(ws, cfg, path), result

    def with_search_settings(self, **overrides: Any) -> "Session":
        """The same session with some ``[search]`` settings replaced (command-line flags, the demo)."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if not overrides:
            return self
        search = self.config.search.model_copy(update=overrides)
        return Session(self.workspace, self.config.model_copy(update={"search": search}), self.config_path,
                       list(self.notes))

    # ---- what works on it ----------------------------------------------------------------------
    def profiled_backend(self) -> str | None:
        """The backend matching the device the workspace was profiled on (cpu), else None."""
        return "cpu" if self.workspace.meta.get("device") == "cpu" else None

    def proposer(self, spec: str = "auto") -> ProposerChoice:
        """``auto``: the LLM agent (with the built-in templates as its fallback) when a provider is
        configured or an API key is in the environment, else the built-in templates; ``agent``:
        the agent or an error saying why not; ``templates``; ``scripted:PLAN.json``."""
        from .agent import resolve
        from .search.proposer import CombinedProposer, ScriptedProposer
        from .templates.proposer import TemplateProposer

        if spec == "templates":
            return ProposerChoice(TemplateProposer(), "the built-in templates (asked for)")
        if spec in ("auto", "agent"):
            cfg, why = resolve(self.config.agent)
            if cfg is None:
                if spec == "agent":
                    raise ForgeError(f"the LLM agent is not available: {why}")
                return ProposerChoice(TemplateProposer(), f"the built-in templates ({why})")
            templates = TemplateProposer()
            agent = self.agent(template=templates)
            return ProposerChoice(CombinedProposer(agent, templates),
                                  f"the LLM agent ({agent.describe()}; {why}) with the built-in templates")
        if spec.startswith("scripted:"):
            path = Path(spec.split(":", 1)[1])
            if not path.is_file():
                raise ForgeError(f"scripted plan not found: {path}")
            return ProposerChoice(ScriptedProposer.from_file(path), f"the scripted plan {path}")
        raise ForgeError(f"unknown proposer '{spec}' (available: {', '.join(PROPOSERS)})")

    def agent(self, *, template: "TemplateProposer | None" = None, provider: Any = None) -> "AgentProposer":
        """The LLM agent for this workspace (ConfigError naming the cause when it cannot be built)."""
        from .agent import build_agent

        return build_agent(self.config, self.workspace.root, template=template, provider=provider)

    def evaluator(self, backend: str | None = None) -> "Evaluator":
        from .evaluator import Evaluator

        return Evaluator(self.workspace.store, self.workspace.cache, self.config, backend=backend or None)

    def pool(self, backend: str | None = None, *, cluster: str | None = None,
             bus: "EventBus | None" = None) -> "EvalPool":
        """The local pool, or with a scheduler's address (``cluster``, else ``[pool] scheduler``)
        the Dask cluster's (``forge_tui.cluster``), reporting its workers on ``bus``."""
        scheduler = cluster or self.config.pool.scheduler
        if scheduler:
            from .cluster.pool import DaskEvalPool

            self.notes.append(f"pool: the Dask cluster at {scheduler}")
            return DaskEvalPool(self.workspace.store, self.config, scheduler=scheduler, backend=backend or None, bus=bus)
        from .search.pool import LocalEvalPool

        return LocalEvalPool(self.workspace.store, self.workspace.cache, self.config, backend=backend or None)

    def discard_search(self) -> int:
        from .search.store import SearchStore

        with self.workspace.git() as repo:
            return SearchStore(repo).delete_all()

    @contextmanager
    def search(self, *, proposer: str = "auto", backend: str | None = None, cards: list[str] | None = None,
               bus: "EventBus | None" = None, cluster: str | None = None) -> Iterator["Search"]:
        """A search over the workspace's cards with its own evaluation pool (``pool``), closed on exit."""
        from .search.events import EventBus
        from .search.runner import Search

        bus = bus or EventBus()
        pool = self.pool(backend, cluster=cluster, bus=bus)
        try:
            choice = self.proposer(proposer)
        except BaseException:
            pool.close()
            raise
        self.notes.append(f"proposer: {choice.why}")
        try:
            yield Search(self.workspace, self.config, choice.proposer, pool, bus=bus, cards=cards)
        finally:
            pool.close()
