"""What a query costs: prices per million tokens, from forge.toml or the provider's list prices.

Each provider declares its vendor's list prices (USD per million tokens) in its ``ProviderSpec``
(``providers/``); they change, so ``[agent]`` prices in forge.toml win over them. A model no list
knows must be priced in forge.toml (0 for a local server): the agent never runs with an unknown
price, since every money limit depends on it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ..config import AgentConfig
from ..errors import ConfigError
from .messages import Usage
from .providers.registry import find, model_name, specs


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


def list_price(provider: str, model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens from the list prices, None when unlisted. A provider
    without list prices (a local server) lists none; one with them (a vendor's API, or a proxy in
    front of one, which may serve another vendor's models) looks in its own list first, then in
    every other provider's. A dated snapshot ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06")
    takes the price of the longest listed name it extends."""
    spec = find(provider)
    if spec is None or not spec.prices:
        return None
    for table in [spec.prices, *(s.prices for s in specs() if s is not spec)]:
        if model in table:
            return table[model]
        known = [m for m in table if model.startswith(m + "-")]
        if known:
            return table[max(known, key=len)]
    return None


def price_for(cfg: AgentConfig) -> Price:
    """The price of the configured model; ConfigError when neither forge.toml nor the list prices have it."""
    model = model_name(cfg)
    inp, out = cfg.input_usd_per_mtok, cfg.output_usd_per_mtok
    if inp is None or out is None:
        listed = list_price(cfg.provider, model)
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
