"""forge.toml: read with tomllib, validated into typed models that reject unknown keys by name.

Discovery order (first found wins): ``--config PATH``, ``./forge.toml``, the workspace's own
``forge.toml``. Secrets never live here: API keys are read from the environment variables the
config names.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "forge.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TimingConfig(_Section):
    warmup: int = Field(3, ge=0)
    repeats: int = Field(20, ge=1)
    cold_l2: bool = True
    """Flush the L2 cache (CUDA) between timed runs. On the CPU backend this is ignored."""
    flush_mib: int = Field(256, ge=1)
    threads: int = Field(0, ge=0)
    """CPU threads for eager PyTorch, torch.compile and a candidate's OpenMP (the cpu backend);
    0 means every core this process may run on. Stated in every timing result."""
    max_spread: float = Field(0.15, gt=0)
    """The evaluator trusts a speedup once the 95% interval of its paired ratios' median is within
    this fraction of the median (and the ratio did not move during the measurement); the profiler
    trusts a time whose inter-quartile range is within this fraction of its median (or within
    twice the timer's resolution)."""
    batch_us: float = Field(200.0, gt=0)
    """Small cards are timed in samples of several calls, each on its own fresh inputs, back to
    back, so that one sample lasts about this long (at most 64 calls)."""
    max_slowdown: float = Field(1.5, gt=1)
    """The machine is busy when the calibration workload runs slower than this factor of its best
    time: the profiler then distrusts its times, and the evaluator times eager and the candidate on
    one thread each (the cpu backend) and samples until the speedup is certain."""
    noisy_retries: int = Field(2, ge=0)
    """Timing attempts repeated when a speedup could not be trusted (its interval stayed wide, or
    the load changed during the measurement), before the result is called noisy."""
    max_samples: int = Field(160, ge=1)
    """Paired samples an evaluation takes at most, an attempt: from 2 x repeats, more (in steps of
    repeats / 2) while the speedup's interval is wider than ``max_spread``."""


class ProfileConfig(_Section):
    ops: bool = True
    """Cards at the single-op (aten) granularity."""
    modules: bool = True
    """Cards for leaf nn.Modules (an RMSNorm written as six tensor ops becomes one card)."""
    chains: bool = True
    """Chain cards: pointwise, cast and reduction ops a module's own forward calls one after
    another, each on an output of the one before (an attention's scale, mask, fp32 softmax and
    cast), one card for the code generator to fuse."""
    skip_views: bool = True
    skip_rng: bool = True
    skip_param_copies: bool = True
    samples_per_card: int = Field(2, ge=1, le=16)
    max_sample_mib: float = Field(512.0, gt=0)
    """A sample whose tensors add up to more than this is not stored (the card keeps the first)."""
    train_mode: bool = False
    forwards: int = Field(1, ge=1)
    """Forward passes captured (the first is also the warm-up for the forward timing)."""


class EvaluatorConfig(_Section):
    backend: Literal["auto", "cuda", "cpu"] = "auto"
    build_timeout_s: float = Field(120.0, gt=0)
    run_timeout_s: float = Field(60.0, gt=0)
    random_sets: int = Field(3, ge=3)
    parallel_builds: int = Field(0, ge=0)
    """0 means one per CPU core."""
    profile_with_ncu: bool = False
    confinement: Literal["required", "off"] = "required"
    """Candidates run in a process confined by seccomp (and Landlock where the kernel has it);
    "off" runs them unconfined (only for machines without libseccomp, and only for code you trust)."""
    landlock: bool = True
    """Narrow the files a candidate's process can open with Landlock, where the kernel has it."""


class SearchConfig(_Section):
    max_evals: int = Field(200, ge=0)
    """Evaluations in all, over every card and every resume."""
    max_wall_s: float = Field(3600.0, gt=0)
    """Wall time of one ``forge search`` run."""
    max_cost_usd: float = Field(20.0, ge=0)
    """LLM spend over every card and every resume."""
    evals_per_card: int = Field(20, ge=1)
    parallel: int = Field(2, ge=1)
    """Evaluations in flight (proposals and compiles run alongside the timed runs)."""
    workers: int = Field(1, ge=1)
    """Evaluator worker processes (one per GPU; on the CPU backend, one)."""
    c_uct: float = Field(0.5, ge=0)
    widen_k: float = Field(1.0, gt=0)
    widen_alpha: float = Field(0.5, gt=0, le=1)
    reward_cap: float = Field(4.0, gt=1)
    """Speedup at which the normalised reward saturates."""
    floor_fraction: float = Field(0.9, gt=0, le=1)
    """A card stops once its best kernel reaches this fraction of the roofline floor."""
    min_gain: float = Field(0.001, ge=0)
    """A card stops once share x (1 - floor / best time) falls below this (0.001 = 0.1% of the forward)."""
    min_share: float = Field(0.0, ge=0, le=1)
    """Cards below this share of the forward are not searched."""
    top: int = Field(0, ge=0)
    """Search only the N cards with the most to gain (0: every eligible card)."""
    proposer_failures: int = Field(3, ge=1)
    """A card stops after this many proposer failures in a row (an LLM API that keeps failing)."""


class AgentConfig(_Section):
    """The LLM agent. The API key is read from the environment variable ``api_key_env`` names
    (never from this file)."""

    provider: str = "auto"
    """A registered provider's name (anthropic, openai, openai-compatible: see
    forge_tui/agent/providers/), auto or none. auto: the first provider whose key variable is set
    (ANTHROPIC_API_KEY, then OPENAI_API_KEY), else no agent (the offline proposers); none: never
    the agent."""
    model: str = ""
    """The provider's model name; empty: the provider's default (its ProviderSpec)."""
    base_url: str = ""
    """An OpenAI-compatible server's URL (vLLM, Ollama, llama.cpp: required for openai-compatible),
    or a proxy in front of Anthropic's or OpenAI's API."""
    api_key_env: str = ""
    """The environment variable holding the key; empty: the provider's own (ANTHROPIC_API_KEY,
    OPENAI_API_KEY; an OpenAI-compatible server without one needs none)."""
    input_usd_per_mtok: float | None = None
    """Price of a million input tokens; unset: the provider's list price for the model (a model
    no list knows must be priced here, 0 for a local server)."""
    output_usd_per_mtok: float | None = None
    cache_read_usd_per_mtok: float | None = None
    """Unset: a tenth of the input price."""
    cache_write_usd_per_mtok: float | None = None
    """Unset: 1.25 times the input price."""
    max_output_tokens: int = Field(8192, ge=256)
    """Output tokens one query may use (less when a limit is near)."""
    request_timeout_s: float = Field(300.0, gt=0)
    retries: int = Field(4, ge=0)
    """Retries of one query on 429, 5xx, timeouts and lost connections, with backoff."""
    failures: int = Field(3, ge=1)
    """Conversations in a row that the provider made fail before the agent stops for the run (the
    search goes on with the other proposers)."""
    max_tool_calls: int = Field(40, ge=1)
    """Per expansion (one conversation, one child)."""
    max_tokens: int = Field(600_000, ge=1000)
    """Input and output tokens per expansion, over all its queries."""
    max_wall_s: float = Field(1200.0, gt=0)
    """Wall time of one expansion."""
    max_cost_usd: float = Field(2.0, ge=0)
    """Money per expansion."""
    max_cost_per_card_usd: float = Field(8.0, ge=0)
    """Money per card over every run (the whole run's cap is [search] max_cost_usd)."""

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        # the registry is read here, not at import: it lives with the agent, which imports this module
        from .agent.providers.registry import CHOICES, names

        known = [*CHOICES, *names()]
        if value not in known:
            expected = ", ".join(repr(k) for k in known[:-1]) + f" or {known[-1]!r}"
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value


class PoolConfig(_Section):
    """Where evaluations run: this machine's pool (the default), or the workers of a Dask cluster."""

    scheduler: str = ""
    """A Dask scheduler's address (``tcp://HOST:8786``): evaluations run on its workers, one per GPU
    (``--resources GPU=1``; ``CPU=1`` for the cpu backend). Empty: the local pool."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """How long to try reaching the scheduler before the search ends with that error."""
    retries: int = Field(2, ge=0, le=10)
    """Times an evaluation whose worker died (killed, lost, out of memory) is run again elsewhere
    before its node fails with the reason."""
    no_worker_s: float = Field(120.0, gt=0)
    """A search stops (resumable) once no worker that can run its evaluations has been seen for this long."""


class ForgeConfig(_Section):
    timing: TimingConfig = TimingConfig()
    profile: ProfileConfig = ProfileConfig()
    evaluator: EvaluatorConfig = EvaluatorConfig()
    search: SearchConfig = SearchConfig()
    agent: AgentConfig = AgentConfig()
    pool: PoolConfig = PoolConfig()


def _describe(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        section, _, key = loc.rpartition(".")
        where = f"[{section}] " if section else ""
        hint = ""
        if "key" in key.lower() or "secret" in key.lower() or "token" in key.lower():
            hint = " (secrets are read from the environment only)"
        return f"{source}: {where}unknown key '{key}'{hint}"
    value = first.get("input")
    return f"{source}: {loc}: {first['msg'].lower()} (got {type(value).__name__} {value!r})"


def parse_config(data: dict, source: str = CONFIG_NAME) -> ForgeConfig:
    try:
        return ForgeConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None


def load_config_file(path: Path) -> ForgeConfig:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return parse_config(data, str(path))


def discover_config(explicit: Path | None = None, workspace: Path | None = None) -> tuple[ForgeConfig, Path | None]:
    """Return the config and the file it came from (None for the built-in defaults)."""
    if explicit is not None:
        return load_config_file(explicit), explicit
    local = Path.cwd() / CONFIG_NAME
    if local.is_file():
        return load_config_file(local), local
    if workspace is not None and (workspace / CONFIG_NAME).is_file():
        return load_config_file(workspace / CONFIG_NAME), workspace / CONFIG_NAME
    return ForgeConfig(), None


def to_toml(cfg: ForgeConfig) -> str:
    """Render a config as TOML (every key, so the workspace's copy documents the defaults)."""
    lines: list[str] = []
    for section, model in cfg:
        lines.append(f"[{section}]")
        for key, value in model:
            if value is None:
                lines.append(f"# {key} =  (unset)")
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (int, float)):
                text = repr(value)
            else:
                text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
            lines.append(f"{key} = {text}")
        lines.append("")
    return "\n".join(lines)
