"""The model behind the agent: Anthropic's Messages API, OpenAI's Chat Completions (and any server
that speaks it: vLLM, Ollama, llama.cpp), or a script of recorded turns for tests.

Each provider turns the neutral conversation (``messages.py``) into its wire format, makes one
call through the vendor's SDK and turns the reply back into a ``ModelTurn``. Retries are the SDKs'
own (``max_retries``: exponential backoff from 0.5 s to 8 s with jitter, honouring ``retry-after-ms``
and ``retry-after``, on 408, 409, 429, 5xx, timeouts and lost connections); what still fails becomes
a ``ProviderError`` whose text has every secret of the environment replaced by ``[redacted]``
(``forge_tui.redaction``).

API keys come from the environment only (``make_provider``); a key is never put into an error, a
repr or a log line.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import anthropic
import openai
from pydantic import ValidationError

from ..config import AgentConfig
from ..errors import ConfigError
from ..redaction import REDACTED, hide, redact, secret_values
from . import resolve
from .messages import (
    AssistantMessage,
    Message,
    ModelTurn,
    Provider,
    ProviderError,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
)
from .pricing import model_name

KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
"""The variable read when ``[agent] api_key_env`` is empty (an OpenAI-compatible server gets no
key unless ``api_key_env`` names one: OpenAI's key is not sent to other servers)."""
NO_KEY = "no-key"
"""What an OpenAI-compatible server without a key is sent (the SDK will not run without one)."""


def _one_line(text: str, limit: int = 300) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- wire formats -------------------------------------------------------------------------------


def anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages API ``messages``: content blocks, tool results as a user message of tool_result
    blocks (the harness note after them), consecutive messages of one role merged (the API wants
    the roles to alternate) and empty assistant messages left out (the API refuses them)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        blocks: list[dict[str, Any]]
        if isinstance(msg, UserMessage):
            role, blocks = "user", [{"type": "text", "text": msg.text}]
        elif isinstance(msg, AssistantMessage):
            role = "assistant"
            blocks = [{"type": "text", "text": msg.text}] if msg.text else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in msg.tool_calls]
        else:
            role = "user"
            blocks = [{"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}
                      for r in msg.results]
            if msg.text:
                blocks.append({"type": "text", "text": msg.text})
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def openai_messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Chat Completions ``messages``: the system prompt first, one "tool" message per result and
    the harness note after them as a user message. Arguments the model wrote that were not a JSON
    object go back as "{}" (servers such as vLLM parse them to render their chat template)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for msg in messages:
        if isinstance(msg, UserMessage):
            out.append({"role": "user", "content": msg.text})
        elif isinstance(msg, AssistantMessage):
            item: dict[str, Any] = {"role": "assistant", "content": msg.text or None}
            if msg.tool_calls:  # OpenAI refuses an empty list
                item["tool_calls"] = [{"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                      for c in msg.tool_calls]
            out.append(item)
        else:
            out += [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in msg.results]
            if msg.text:
                out.append({"role": "user", "content": msg.text})
    return out


def parse_arguments(call_id: str, name: str, raw: Any) -> ToolCall:
    """A tool call from the model's arguments, which should be a JSON object in a string; when
    they are not, the call keeps them in ``raw_arguments`` and says why in ``arguments_error``."""
    if isinstance(raw, dict):  # some servers send the object itself
        return ToolCall(id=call_id, name=name, arguments=raw, raw_arguments=json.dumps(raw))
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    if not raw.strip():  # a call without arguments, as some servers write it
        return ToolCall(id=call_id, name=name, raw_arguments=raw)
    try:
        value = json.loads(raw)
    except ValueError as err:
        return ToolCall(id=call_id, name=name, raw_arguments=raw, arguments_error=f"the arguments are not valid JSON ({err})")
    if not isinstance(value, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=raw,
                        arguments_error=f"the arguments are not a JSON object (got {type(value).__name__})")
    return ToolCall(id=call_id, name=name, arguments=value, raw_arguments=raw)


# -- the providers ------------------------------------------------------------------------------

_RETRYABLE_STATUS = (408, 409, 429)


class _SDKProvider:
    """What both SDK providers share: the secrets to hide and the mapping of SDK exceptions."""

    name: str
    model: str

    def __init__(self, model: str, base_url: str, timeout_s: float, secrets: Iterable[str]) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._secrets = sorted(set(secrets), key=len, reverse=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _error(self, text: str, *, retryable: bool, status: int | None = None) -> ProviderError:
        # secrets are hidden before the line is cut short: a key cut in two would no longer match
        return ProviderError(_one_line(f"{self.name}: {hide(text, self._secrets)}"), retryable=retryable, status=status)

    def _sdk_error(self, err: Exception) -> ProviderError:
        """One line naming the provider, the status and the server's message (keys hidden)."""
        request = getattr(err, "request", None)
        retries = request.headers.get("x-stainless-retry-count", "0") if request is not None else "0"
        after = {"": "", "0": "", "1": " after 1 retry"}.get(retries, f" after {retries} retries")
        status = getattr(err, "status_code", None)
        if isinstance(status, int):
            retryable = status in _RETRYABLE_STATUS or status >= 500
            return self._error(f"HTTP {status}{after}: {_server_message(err)}", retryable=retryable, status=status)
        if isinstance(err, (anthropic.APITimeoutError, openai.APITimeoutError)):
            return self._error(f"no reply within {self.timeout_s:g} s{after}", retryable=True)
        if isinstance(err, (anthropic.APIConnectionError, openai.APIConnectionError)):
            cause = f": {err.__cause__}" if err.__cause__ is not None else ""
            return self._error(f"cannot reach {self.base_url or 'the API'}{after}{cause}", retryable=True)
        return self._error(f"{type(err).__name__}: {err}", retryable=False)

    def _unexpected(self, err: Exception) -> ProviderError:
        return self._error(f"unexpected reply ({type(err).__name__}: {err})", retryable=False)


def _server_message(err: Exception) -> str:
    body = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return str(inner["message"])
    if isinstance(body, str) and body:
        return body
    return str(getattr(err, "message", err))


EPHEMERAL = {"type": "ephemeral"}
"""Anthropic's cache breakpoint (the default five-minute cache)."""


class AnthropicProvider(_SDKProvider):
    """Claude through the Messages API (non-streaming, with tools)."""

    name = "anthropic"

    def __init__(self, model: str, api_key: str, *, base_url: str = "", timeout_s: float = 300.0, retries: int = 4,
                 secrets: Iterable[str] = ()) -> None:
        super().__init__(model, base_url, timeout_s, [api_key, *secrets])
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url or None, timeout=timeout_s,
                                           max_retries=retries)

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        wire = anthropic_messages(messages)
        # prompt caching: the tools and the system prompt (one breakpoint after the system prompt),
        # and the conversation so far (one on the newest block); each query then pays the cache-read
        # price for everything the previous query sent, and the cache-write price for what is new
        if wire:
            wire[-1]["content"][-1] = {**wire[-1]["content"][-1], "cache_control": EPHEMERAL}
        request: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": wire}
        if system:
            request["system"] = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        if tools:
            request["tools"] = [t.anthropic() for t in tools]
        try:
            reply = self._client.messages.create(**request)
        except anthropic.AnthropicError as err:
            raise self._sdk_error(err) from None
        try:
            return self._turn(reply)
        except (AttributeError, TypeError, ValueError) as err:
            raise self._unexpected(err) from None

    def _turn(self, reply: Any) -> ModelTurn:
        text = "".join(b.text for b in reply.content if b.type == "text")
        calls = [parse_arguments(b.id, b.name, b.input) for b in reply.content if b.type == "tool_use"]
        u = reply.usage
        usage = Usage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                      cache_read_tokens=u.cache_read_input_tokens or 0,
                      cache_write_tokens=u.cache_creation_input_tokens or 0) if u is not None else Usage()
        return ModelTurn(message=AssistantMessage(text=text, tool_calls=calls), stop_reason=reply.stop_reason or "",
                         usage=usage, model=reply.model or self.model, request_id=getattr(reply, "_request_id", None))


class OpenAIProvider(_SDKProvider):
    """Chat Completions with function tools, on OpenAI's API or a compatible server (``base_url``).

    The output limit goes out as ``max_completion_tokens`` to OpenAI (its reasoning models refuse
    ``max_tokens``) and as ``max_tokens`` to compatible servers (every one reads it; llama.cpp
    before 2026, llamafile and llama-cpp-python ignore ``max_completion_tokens``)."""

    def __init__(self, model: str, api_key: str, *, base_url: str = "", compatible: bool = False,
                 timeout_s: float = 300.0, retries: int = 4, secrets: Iterable[str] = ()) -> None:
        super().__init__(model, base_url, timeout_s, [api_key, *secrets])
        self.name = "openai-compatible" if compatible else "openai"
        self._max_tokens_field = "max_tokens" if compatible else "max_completion_tokens"
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url or None, timeout=timeout_s,
                                     max_retries=retries)

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        request: dict[str, Any] = {"model": self.model, "messages": openai_messages(system, messages),
                                   self._max_tokens_field: max_tokens}
        if tools:  # OpenAI refuses an empty list
            request["tools"] = [t.openai() for t in tools]
        try:
            reply = self._client.chat.completions.create(**request)
        except openai.OpenAIError as err:
            raise self._sdk_error(err) from None
        if not reply.choices:  # a proxy passing on its upstream's failure in a 200
            raise self._error("the reply has no choices", retryable=True)
        try:
            return self._turn(reply)
        except (AttributeError, TypeError, ValueError) as err:
            raise self._unexpected(err) from None

    def _turn(self, reply: Any) -> ModelTurn:
        choice = reply.choices[0]
        msg = choice.message
        calls = []
        for i, tc in enumerate(msg.tool_calls or []):
            fn = getattr(tc, "function", None)
            call_id = tc.id or f"call_{i}"
            if fn is None:
                calls.append(ToolCall(id=call_id, name=getattr(tc, "type", "") or "", arguments_error="not a function call"))
            else:
                calls.append(parse_arguments(call_id, fn.name, fn.arguments))
        usage = Usage()
        if reply.usage is not None:  # some local servers send none
            details = reply.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            prompt = reply.usage.prompt_tokens or 0
            usage = Usage(input_tokens=max(prompt - cached, 0), output_tokens=reply.usage.completion_tokens or 0,
                          cache_read_tokens=cached)
        return ModelTurn(message=AssistantMessage(text=msg.content or msg.refusal or "", tool_calls=calls),
                         stop_reason=choice.finish_reason or "", usage=usage, model=reply.model or self.model,
                         request_id=getattr(reply, "_request_id", None))


def make_provider(cfg: AgentConfig, environ: Mapping[str, str] = os.environ) -> Provider:
    """The provider ``[agent]`` names, its key read from the environment; ConfigError (naming the
    variable, never its value) when it cannot be built."""
    resolved, why = resolve(cfg, environ)  # "auto" made concrete, as the agent does it
    if resolved is None:
        raise ConfigError(f"the LLM agent is not available: {why}")
    cfg = resolved
    model = model_name(cfg)
    if not model:
        raise ConfigError(f"[agent] model is empty: an {cfg.provider} server needs the name of the model it serves")
    compatible = cfg.provider == "openai-compatible"
    if compatible and not cfg.base_url:
        raise ConfigError("[agent] base_url is empty: an openai-compatible provider needs the server's URL "
                          "(e.g. http://localhost:8000/v1)")
    var = cfg.api_key_env or KEY_ENV.get(cfg.provider, "")
    key = environ.get(var, "") if var else ""
    if not key and var:
        raise ConfigError(f"[agent] the API key variable {var} is not set in the environment")
    common: dict[str, Any] = {"base_url": cfg.base_url, "timeout_s": cfg.request_timeout_s, "retries": cfg.retries,
                              "secrets": secret_values(environ, [var] if var else [])}
    if cfg.provider == "anthropic":
        return AnthropicProvider(model, key, **common)
    return OpenAIProvider(model, key or NO_KEY, compatible=compatible, **common)


# -- a script of turns --------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptedCall:
    """What a ScriptedProvider was asked."""

    system: str
    messages: list[Message]
    tools: list[ToolSpec]
    max_tokens: int


class ScriptedProvider:
    """Replays recorded turns in order (a ProviderError entry is raised in its turn) and records
    every query; for tests and for replaying a conversation without a model."""

    name = "scripted"

    def __init__(self, turns: Sequence[ModelTurn | ProviderError], model: str = "scripted") -> None:
        self.model = model
        self.turns = list(turns)
        self.calls: list[ScriptedCall] = []

    def __repr__(self) -> str:
        return f"ScriptedProvider({len(self.calls)} of {len(self.turns)} turns used)"

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        self.calls.append(ScriptedCall(system, list(messages), list(tools), max_tokens))
        if len(self.calls) > len(self.turns):
            raise ProviderError("the script has no more turns", retryable=False)
        turn = self.turns[len(self.calls) - 1]
        if isinstance(turn, ProviderError):
            raise turn
        return turn

    @classmethod
    def from_file(cls, path: Path | str) -> ScriptedProvider:
        """A JSON list: ModelTurns as JSON, or {"error": "...", "retryable": bool, "status": int}."""
        try:
            items = json.loads(Path(path).read_text())
            if not isinstance(items, list):
                raise ValueError("not a JSON list")
            turns: list[ModelTurn | ProviderError] = [
                ProviderError(str(it["error"]), retryable=bool(it.get("retryable", False)), status=it.get("status"))
                if isinstance(it, dict) and "error" in it else ModelTurn.model_validate(it)
                for it in items]
        except (OSError, ValueError, ValidationError) as err:
            raise ConfigError(f"{path}: not a script of model turns: {_one_line(str(err))}") from None
        return cls(turns)


__all__ = ["AnthropicProvider", "OpenAIProvider", "ScriptedProvider", "ScriptedCall", "make_provider", "redact",
           "secret_values", "anthropic_messages", "openai_messages", "parse_arguments", "KEY_ENV", "NO_KEY", "REDACTED"]
