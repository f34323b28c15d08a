"""The conversation the agent holds, in one provider-neutral form.

A provider (``providers/``) turns these messages into Anthropic's or OpenAI's wire format and the
model's reply back into a ``ModelTurn``; the loop (``loop.py``), the tools (``agent_tools``) and the
transcript see only these types. Tool definitions are data (``ToolSpec``: a name, a description and
a JSON Schema) rendered to either provider's tool format by the two methods below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Usage(_Msg):
    """Tokens one query used (as the provider reported them)."""

    input_tokens: int = 0
    """Uncached input tokens."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(input_tokens=self.input_tokens + other.input_tokens,
                     output_tokens=self.output_tokens + other.output_tokens,
                     cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
                     cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens)

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


class ToolCall(_Msg):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str = ""
    """The arguments as the model wrote them (kept when they are not a JSON object)."""
    arguments_error: str | None = None
    """Why the arguments could not be read (not JSON, not an object); the loop tells the model."""


class ToolResult(_Msg):
    call_id: str
    name: str
    content: str
    is_error: bool = False


class UserMessage(_Msg):
    role: Literal["user"] = "user"
    text: str


class AssistantMessage(_Msg):
    role: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolResultsMessage(_Msg):
    """The results of every tool call of the assistant message before it, in order, and optionally
    a note from the harness (limits left, a format error) sent with them."""

    role: Literal["tool"] = "tool"
    results: list[ToolResult]
    text: str = ""


Message = Annotated[Union[UserMessage, AssistantMessage, ToolResultsMessage], Field(discriminator="role")]


class ToolSpec(_Msg):
    """One tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON Schema of the arguments (an object)."""

    def anthropic(self) -> dict[str, Any]:
        """Anthropic Messages API tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    def openai(self) -> dict[str, Any]:
        """OpenAI Chat Completions function tool (OpenAI-compatible servers read the same)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


class ModelTurn(_Msg):
    """One reply of the model."""

    message: AssistantMessage
    stop_reason: str = ""
    """As the provider said it ("end_turn", "tool_use", "max_tokens", "stop", "tool_calls", "length")."""
    usage: Usage = Usage()
    model: str = ""
    request_id: str | None = None


class ProviderError(Exception):
    """A query that failed after the provider's retries. ``retryable`` failures (429, 5xx, timeouts,
    connection errors) may pass; others (401, 400, a model that does not exist) will not. The
    message never holds an API key."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class Provider(Protocol):
    name: str
    """A registered provider's name (``providers/registry.py``), or "scripted"."""
    model: str

    def query(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], max_tokens: int) -> ModelTurn:
        """One model call; raises ProviderError when it fails."""
        ...


__all__ = ["Usage", "ToolCall", "ToolResult", "UserMessage", "AssistantMessage", "ToolResultsMessage", "Message",
           "ToolSpec", "ModelTurn", "ProviderError", "Provider"]
