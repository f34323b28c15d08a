"""A script of recorded turns in place of a model: for tests and for replaying a conversation.
It is passed to the agent directly (``build_agent(..., provider=...)``), never chosen by
``[agent] provider``, so it declares no ``ProviderSpec``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pydantic import ValidationError

from ...errors import ConfigError
from ..messages import Message, ModelTurn, ProviderError, ToolSpec
from .sdk import one_line


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
            raise ConfigError(f"{path}: not a script of model turns: {one_line(str(err))}") from None
        return cls(turns)
