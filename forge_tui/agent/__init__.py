"""The LLM agent: a tool-using kernel engineer (``loop.py``) behind the Proposer interface
(``proposer.py``), speaking to Anthropic, OpenAI or any OpenAI-compatible server (``providers/``:
one module per provider, found through one registry), with every query's cost bounded before it
is made (``pricing.py``, ``forge_tui.search.ledger``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .providers.registry import resolve

if TYPE_CHECKING:
    from ..config import ForgeConfig
    from ..templates.proposer import TemplateProposer
    from .proposer import AgentProposer

__all__ = ["resolve", "agent_parts", "build_agent"]


def agent_parts(config: ForgeConfig, environ: Mapping[str, str], provider: Any = None,
                unavailable: str = "the LLM agent is not available") -> tuple[Any, Any, Any, Callable[[str], str]]:
    """(the resolved agent configuration, the provider, its price, the redaction of secrets): what
    every use of the LLM builds first. ConfigError, ``unavailable: why``, when there is no provider
    (no key, an OpenAI-compatible provider without a URL); ``provider`` replaces the configured
    one (tests, replays)."""
    from ..errors import ConfigError
    from ..redaction import treat_as_secret
    from .pricing import price_for
    from .providers import make_provider, redact

    cfg, why = resolve(config.agent, environ)
    if cfg is None and provider is None:
        raise ConfigError(f"{unavailable}: {why}")
    cfg = cfg or config.agent.model_copy(update={"provider": "openai-compatible"})
    price = price_for(cfg)
    prov = provider if provider is not None else make_provider(cfg, environ)
    names = [cfg.api_key_env] if cfg.api_key_env else []
    treat_as_secret(*names)  # the git wrapper refuses a file holding it, as it does the default keys
    return cfg, prov, price, lambda text: redact(text, environ, names)


def build_agent(config: ForgeConfig, workspace_root: Path, *, environ: Mapping[str, str] = os.environ,
                template: "TemplateProposer | None" = None, provider: Any = None) -> "AgentProposer":
    """The agent for a workspace; ConfigError (naming the cause) when it cannot be built: no key,
    an unknown price, an OpenAI-compatible provider without a URL. ``provider`` replaces the one
    the configuration names (tests, replays)."""
    import json

    from ..kernels.device import detect_device
    from .proposer import AgentProposer

    cfg, prov, price, redact = agent_parts(config, environ, provider)
    try:
        profile = json.loads((workspace_root / "profile.json").read_text())
    except (OSError, ValueError):
        profile = {}
    return AgentProposer(config.model_copy(update={"agent": cfg}), prov, price,
                         workdir_root=workspace_root / ".forge" / "agent", profile=profile, gpu=detect_device(),
                         template=template, redact=redact)
