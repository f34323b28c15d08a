"""What a query costs: prices per million tokens, from forge.toml or a built-in table.

The table holds list prices (USD per million tokens) as the providers published them; they change,
so ``[agent]`` prices in forge.toml win over it. A model the table does not know must be priced in
forge.toml (0 for a local server): the agent never runs with an unknown price, since every money
limit depends on it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ..config import AgentConfig
from ..errors import ConfigError
from .messages import Usage

DEFAULT_MODEL = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5", "openai-compatible": ""}

# (input, output) USD per million tokens; list prices as published by the providers in 2025-2026
# (claude-sonnet-4-5 reached its end of life on 2026-11-30: the anthropic SDK lists it as deprecated)
TABLE: dict[str, tuple[float, float]] = {
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.4),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-4o": (2.5, 10.0),
    "o3": (2.0, 8.0),
    "o4-mini": (1.1, 4.4),
}


class Price(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input + usage.output_tokens * self.output +
                usage.cache_read_tokens * self.cache_read + usage.cache_write_tokens * self.cache_write) / 1e6

    def worst_case(self, input_tokens: int, output_tokens: int) -> float:
        """The most a query of at most these many tokens can cost (every input token uncached or
        written to the cache, whichever is dearer)."""
        return (input_tokens * max(self.input, self.cache_write, self.cache_read) + output_tokens * self.output) / 1e6


def model_name(cfg: AgentConfig) -> str:
    return cfg.model or DEFAULT_MODEL.get(cfg.provider, "")


def _table_price(model: str) -> tuple[float, float] | None:
    if model in TABLE:
        return TABLE[model]
    # dated snapshots ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06"): the longest known prefix
    known = [m for m in TABLE if model.startswith(m + "-")]
    return TABLE[max(known, key=len)] if known else None


def price_for(cfg: AgentConfig) -> Price:
    """The price of the configured model; ConfigError when neither forge.toml nor the table has it."""
    model = model_name(cfg)
    inp, out = cfg.input_usd_per_mtok, cfg.output_usd_per_mtok
    if inp is None or out is None:
        listed = _table_price(model) if cfg.provider in ("anthropic", "openai") else None
        if listed is None:
            raise ConfigError(f"[agent] the price of model '{model or '(none)'}' is not known: set input_usd_per_mtok "
                              "and output_usd_per_mtok in forge.toml (0 for a local server)")
        inp = listed[0] if inp is None else inp
        out = listed[1] if out is None else out
    if inp < 0 or out < 0:
        raise ConfigError("[agent] prices cannot be negative")
    cr = cfg.cache_read_usd_per_mtok if cfg.cache_read_usd_per_mtok is not None else inp / 10
    cw = cfg.cache_write_usd_per_mtok if cfg.cache_write_usd_per_mtok is not None else inp * 1.25
    return Price(input=inp, output=out, cache_read=cr, cache_write=cw)
