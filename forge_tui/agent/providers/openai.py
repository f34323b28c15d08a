"""OpenAI: Chat Completions with function tools, on OpenAI's API (``SPEC``) or on a server that
speaks it (``openai_compatible.py``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..messages import AssistantMessage, Message, ModelTurn, ToolCall, ToolSpec, Usage, UserMessage
from .registry import Connection, ProviderSpec
from .sdk import SDKProvider, parse_arguments

if TYPE_CHECKING:
    import openai

PRICES: dict[str, tuple[float, float]] = {
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.4),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-4o": (2.5, 10.0),
    "o3": (2.0, 8.0),
    "o4-mini": (1.1, 4.4),
}
"""OpenAI's list prices, (input, output) USD per million tokens."""


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


class OpenAIProvider(SDKProvider):
    """Chat Completions with function tools, on OpenAI's API or a compatible server (``base_url``).
    The SDK is imported when the first provider is built, not when forge starts.

    The output limit goes out as ``max_completion_tokens`` to OpenAI (its reasoning models refuse
    ``max_tokens``) and as ``max_tokens`` to compatible servers (every one reads it; older
    llama.cpp, llamafile and llama-cpp-python ignore ``max_completion_tokens``)."""

    def __init__(self, model: str, api_key: str, *, base_url: str = "", compatible: bool = False,
                 timeout_s: float = 300.0, retries: int = 4, secrets: Iterable[str] = ()) -> None:
        import openai

        super().__init__(model, base_url, timeout_s, [api_key, *secrets])
        self.name = "openai-compatible" if compatible else "openai"
        self._max_tokens_field = "max_tokens" if compatible else "max_completion_tokens"
        self._client: openai.OpenAI = openai.OpenAI(api_key=api_key, base_url=base_url or None, timeout=timeout_s,
                                                    max_retries=retries)

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        import openai

        request: dict[str, Any] = {"model": self.model, "messages": openai_messages(system, messages),
                                   self._max_tokens_field: max_tokens}
        if tools:  # OpenAI refuses an empty list
            request["tools"] = [t.openai() for t in tools]
        try:
            reply = self._client.chat.completions.create(**request)
        except openai.OpenAIError as err:
            raise self._sdk_error(err, openai.APITimeoutError, openai.APIConnectionError) from None
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


def _build(c: Connection) -> OpenAIProvider:
    return OpenAIProvider(c.model, c.api_key, base_url=c.base_url, timeout_s=c.timeout_s, retries=c.retries,
                          secrets=c.secrets)


SPEC = ProviderSpec(name="openai", key_env="OPENAI_API_KEY", default_model="gpt-5", prices=PRICES, factory=_build)
