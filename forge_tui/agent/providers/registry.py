"""Which providers the agent can speak to: each declared once, as a ``ProviderSpec`` in its own
module (``anthropic.py``, ``openai.py``, ``openai_compatible.py``), and listed in ``BUILTIN``.

Everything that depends on the set of providers reads this registry: the configuration's check
of ``[agent] provider``, the choice ``auto`` makes, the factory (``make_provider``), the price
table (``pricing.py``) and the variables whose values are secrets (``forge_tui.redaction``).
Adding a provider is one module declaring its ``SPEC`` plus its name in ``BUILTIN``; a test or a
plugin may also ``register`` one at run time.

Reading the registry imports no LLM SDK: the provider modules import theirs when a provider is
built.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Callable, Mapping

from ...errors import ConfigError
from ...redaction import secret_values

if TYPE_CHECKING:
    from ...config import AgentConfig
    from ..messages import Provider

BUILTIN = ("anthropic", "openai", "openai_compatible")
"""The modules (in this package) declaring the built-in providers, in the order ``auto`` tries
their keys."""
CHOICES = ("auto", "none")
"""What ``[agent] provider`` takes besides a provider's name."""


@dataclass(frozen=True)
class Connection:
    """What a provider is built from: the settings of ``[agent]`` with the model and the key made
    concrete (the key read from the environment, "" when the provider takes none)."""

    model: str
    api_key: str = field(repr=False)
    base_url: str = ""
    timeout_s: float = 300.0
    retries: int = 4
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Every secret of the environment, for the provider to hide in its errors."""


@dataclass(frozen=True)
class ProviderSpec:
    """One provider, as the rest of forge knows it."""

    name: str
    """What ``[agent] provider`` says to choose it."""
    key_env: str
    """The variable holding its API key when ``[agent] api_key_env`` is empty ("": the provider
    needs no key unless ``api_key_env`` names one). Its value is a secret everywhere, and ``auto``
    chooses the provider when it is set."""
    default_model: str
    """The model used when ``[agent] model`` is empty ("": the model must be configured)."""
    prices: Mapping[str, tuple[float, float]]
    """List prices, (input, output) USD per million tokens by model name (empty: every model's
    price must be configured); forge.toml's prices win over them."""
    factory: Callable[[Connection], "Provider"] = field(repr=False)
    """Builds the provider; ConfigError (naming the setting) when the configuration cannot work."""


_SPECS: dict[str, ProviderSpec] = {}
_LOCK = threading.RLock()  # re-entrant: a call during the built-ins' import fails, never hangs
_loaded = False


def _load_builtin() -> None:
    """Register the built-in providers, once, before the registry is first read or extended."""
    global _loaded
    if _loaded:  # the common case, read without the lock (redaction asks on every call)
        return
    with _LOCK:
        if _loaded:
            return
        for spec in [import_module(f"{__package__}.{module}").SPEC for module in BUILTIN]:
            _add(spec)
        _loaded = True


def _add(spec: ProviderSpec) -> None:
    if not spec.name:
        raise ValueError("a provider needs a name")
    if spec.name in _SPECS or spec.name in CHOICES:
        raise ValueError(f"a provider named {spec.name!r} is already registered")
    _SPECS[spec.name] = spec


def register(spec: ProviderSpec) -> ProviderSpec:
    """Add a provider (after the built-in ones); ValueError when its name is taken."""
    _load_builtin()
    with _LOCK:
        _add(spec)
    return spec


def unregister(name: str) -> None:
    """Remove a provider ``register`` added (tests)."""
    _load_builtin()
    with _LOCK:
        _SPECS.pop(name, None)


def specs() -> tuple[ProviderSpec, ...]:
    """Every registered provider, the built-in ones first, in the order ``auto`` tries them."""
    _load_builtin()
    return tuple(_SPECS.values())


def names() -> tuple[str, ...]:
    return tuple(s.name for s in specs())


def find(name: str) -> ProviderSpec | None:
    _load_builtin()
    return _SPECS.get(name)


def key_variables() -> tuple[str, ...]:
    """The variables holding the registered providers' API keys."""
    return tuple(s.key_env for s in specs() if s.key_env)


def model_name(cfg: "AgentConfig") -> str:
    """The configured model, else the provider's default ("" when it has none)."""
    spec = find(cfg.provider)
    return cfg.model or (spec.default_model if spec is not None else "")


def resolve(cfg: "AgentConfig", environ: Mapping[str, str] = os.environ) -> tuple["AgentConfig | None", str]:
    """The ``[agent]`` settings with a concrete provider, or None and why there is no agent.
    ``auto`` takes the first provider whose key variable (or ``[agent] api_key_env``) is set."""
    if cfg.provider == "none":
        return None, '[agent] provider is "none"'
    if cfg.provider != "auto":
        return cfg, f"[agent] provider {cfg.provider}"
    keyed = [s for s in specs() if s.key_env]
    for spec in keyed:
        var = cfg.api_key_env or spec.key_env
        if environ.get(var):
            return cfg.model_copy(update={"provider": spec.name}), f"{var} is set"
    return None, f"no LLM API key in the environment ({' or '.join(s.key_env for s in keyed)})"


def make_provider(cfg: "AgentConfig", environ: Mapping[str, str] = os.environ) -> "Provider":
    """The provider ``[agent]`` names, its key read from the environment; ConfigError (naming the
    variable, never its value) when it cannot be built."""
    resolved, why = resolve(cfg, environ)  # "auto" made concrete, as the agent does it
    if resolved is None:
        raise ConfigError(f"the LLM agent is not available: {why}")
    spec = find(resolved.provider)
    if spec is None:
        raise ConfigError(f"[agent] provider {resolved.provider!r} is not one of {', '.join(names())}")
    model = resolved.model or spec.default_model
    if not model:
        raise ConfigError(f"[agent] model is empty: an {spec.name} server needs the name of the model it serves")
    var = resolved.api_key_env or spec.key_env
    key = environ.get(var, "") if var else ""
    if not key and var:
        raise ConfigError(f"[agent] the API key variable {var} is not set in the environment")
    return spec.factory(Connection(model=model, api_key=key, base_url=resolved.base_url,
                                   timeout_s=resolved.request_timeout_s, retries=resolved.retries,
                                   secrets=tuple(secret_values(environ, [var] if var else []))))
