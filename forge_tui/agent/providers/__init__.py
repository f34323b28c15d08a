"""The model behind the agent: Anthropic's Messages API (``anthropic.py``), OpenAI's Chat
Completions (``openai.py``) and any server that speaks it (``openai_compatible.py``: vLLM, Ollama,
llama.cpp), each declared once as a ``ProviderSpec`` and found through the registry
(``registry.py``); or a script of recorded turns for tests (``scripted.py``).

Each provider turns the neutral conversation (``messages.py``) into its wire format, makes one
call through the vendor's SDK and turns the reply back into a ``ModelTurn``; what fails becomes a
``ProviderError`` with every secret hidden (``sdk.py``).

API keys come from the environment only (``make_provider``); a key is never put into an error, a
repr or a log line. Importing this package imports no SDK: a provider imports its SDK when built.
"""

from __future__ import annotations

from ...redaction import REDACTED, redact, secret_values
from .anthropic import AnthropicProvider, anthropic_messages
from .openai import OpenAIProvider, openai_messages
from .openai_compatible import NO_KEY
from .registry import (
    Connection,
    ProviderSpec,
    find,
    key_variables,
    make_provider,
    model_name,
    names,
    register,
    resolve,
    specs,
    unregister,
)
from .scripted import ScriptedCall, ScriptedProvider
from .sdk import parse_arguments

__all__ = ["AnthropicProvider", "OpenAIProvider", "ScriptedProvider", "ScriptedCall", "make_provider", "redact",
           "secret_values", "anthropic_messages", "openai_messages", "parse_arguments", "NO_KEY", "REDACTED",
           "Connection", "ProviderSpec", "register", "unregister", "find", "names", "specs", "key_variables", "model_name",
           "resolve"]
