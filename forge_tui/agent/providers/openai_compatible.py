"""A server that speaks OpenAI's Chat Completions (vLLM, Ollama, llama.cpp, a proxy): its URL and
model must be configured, its prices too (0 for a local server), and it is sent no key unless
``[agent] api_key_env`` names one (OpenAI's key is never sent to another server)."""

from __future__ import annotations

from ...errors import ConfigError
from .openai import OpenAIProvider
from .registry import Connection, ProviderSpec

NO_KEY = "no-key"
"""What a server without a key is sent (the SDK will not run without one)."""


def _build(c: Connection) -> OpenAIProvider:
    if not c.base_url:
        raise ConfigError("[agent] base_url is empty: an openai-compatible provider needs the server's URL "
                          "(e.g. http://localhost:8000/v1)")
    return OpenAIProvider(c.model, c.api_key or NO_KEY, base_url=c.base_url, compatible=True, timeout_s=c.timeout_s,
                          retries=c.retries, secrets=c.secrets)


SPEC = ProviderSpec(name="openai-compatible", key_env="", default_model="", prices={}, factory=_build)
