"""What the client sends the judge for one evaluation: typed, validated on arrival, with the
defaults written once (in the config models), not again on the judge's side."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import TimingConfig


class JudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = None
    random_sets: int = 3
    timing: bool = True
    compile_baseline: bool | Literal["auto"] = "auto"
    adversarial: bool = True
    call_timeout_s: float = 60.0
    confinement: Literal["required", "off"] = "required"
    landlock: bool = True
    near_duplicates: int = Field(6, ge=0)
    """Calls of the state check (``Evaluation.check_state``): inputs each one element apart from
    the one before, then the first again; 0 skips it."""


class JudgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    card: dict[str, Any]
    library: str
    runner: str
    store: str
    device: Literal["cpu", "cuda"]
    options: JudgeOptions = JudgeOptions()
    timing: TimingConfig = TimingConfig()
