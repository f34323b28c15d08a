"""Anthropic: Claude through the Messages API (non-streaming, with tools), with prompt caching."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..messages import AssistantMessage, Message, ModelTurn, ToolSpec, Usage, UserMessage
from .registry import Connection, ProviderSpec
from .sdk import SDKProvider, parse_arguments

if TYPE_CHECKING:
    import anthropic

PRICES: dict[str, tuple[float, float]] = {
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),  # deprecated by Anthropic; priced while it still answers
    "claude-sonnet-4": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
}
"""Anthropic's list prices, (input, output) USD per million tokens."""

EPHEMERAL = {"type": "ephemeral"}
"""Anthropic's cache breakpoint (the default five-minute cache)."""


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


class AnthropicProvider(SDKProvider):
    """Claude through the Messages API (non-streaming, with tools). The SDK is imported when the
    first provider is built, not when forge starts."""

    name = "anthropic"

    def __init__(self, model: str, api_key: str, *, base_url: str = "", timeout_s: float = 300.0, retries: int = 4,
                 secrets: Iterable[str] = ()) -> None:
        import anthropic

        super().__init__(model, base_url, timeout_s, [api_key, *secrets])
        self._client: anthropic.Anthropic = anthropic.Anthropic(api_key=api_key, base_url=base_url or None,
                                                                timeout=timeout_s, max_retries=retries)

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        import anthropic

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
            raise self._sdk_error(err, anthropic.APITimeoutError, anthropic.APIConnectionError) from None
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


def _build(c: Connection) -> AnthropicProvider:
    return AnthropicProvider(c.model, c.api_key, base_url=c.base_url, timeout_s=c.timeout_s, retries=c.retries,
                             secrets=c.secrets)


SPEC = ProviderSpec(name="anthropic", key_env="ANTHROPIC_API_KEY", default_model="claude-sonnet-4-6", prices=PRICES,
                    factory=_build)
