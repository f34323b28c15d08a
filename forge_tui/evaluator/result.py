"""The evaluator's result, typed: what the CLI, the search, the agent's tools and the app read.

``EvalResult`` and its parts (static findings, build diagnostics, correctness per input set, timing
with spread, the quiet check, the profile report) are pydantic models with a schema version and an
exact JSON round trip: ``EvalResult.from_json(r.to_json()) == r``. Results written before the
schema existed (version 1, plain dicts in git) read back through the same models: every field added
since has a default, and keys a model does not know are kept as they are.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2
Status = Literal["passed", "noisy", "rejected", "build_failed", "crash", "timeout", "error"]
STATUSES: tuple[str, ...] = ("passed", "noisy", "rejected", "build_failed", "crash", "timeout", "error")


class _Part(BaseModel):
    # extra="allow": keys from other versions survive a round trip; inf and NaN are written as
    # JSON's Infinity and NaN (as Python's json module does), so they survive it too
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")


class Finding(_Part):
    rule: str
    severity: str
    message: str
    line: int | None = None


class StaticReport(_Part):
    findings: list[Finding] = Field(default_factory=list)
    enforced: bool = True


class Diagnostic(_Part):
    file: str
    line: int | None = None
    column: int | None = None
    severity: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        return f"{where}: {self.severity}: {self.message}"


class BuildReport(_Part):
    ok: bool
    backend: str
    key: str
    library: str | None = None
    seconds: float = 0.0
    cached: bool = False
    command: list[str] = Field(default_factory=list)
    log: str = ""
    reason: str = ""
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    resources: dict[str, dict[str, int]] = Field(default_factory=dict)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


class InputSetResult(_Part):
    name: str
    ok: bool = True
    determinism: str = "bitwise"
    degenerate: bool = False
    eager_off: int = 0
    """Elements where the candidate missed eager's output and was accepted because it met the
    program's float64 result there and was closer to it than eager (the evaluator's arbiter)."""


class Correctness(_Part):
    sets: list[InputSetResult] = Field(default_factory=list)
    seed: int | None = None
    degenerate_card: bool = False
    scalars: list[list[Any]] = Field(default_factory=list)
    state_calls: int = 0
    """Calls on near-duplicate inputs (each one element apart from the one before, then the first
    again), every output checked against its own input's: none returned an earlier call's."""


class TimeStats(_Part):
    """Times in µs (or ratios, for speedups): median and spread of the samples."""

    median: float
    mean: float
    min: float
    max: float
    q1: float
    q3: float
    n: int
    spread: float = 0.0


class Attempt(_Part):
    attempt: int
    quiet: bool
    reasons: list[str] = Field(default_factory=list)
    skipped: bool = False
    calibration_us: list[float] = Field(default_factory=list)
    candidate_median_us: float | None = None
    eager_median_us: float | None = None
    notes: list[str] = Field(default_factory=list)
    """Signs of load that do not deny a verdict (a busy calibration, spreads, eager slower than
    its profile): paired samples cancel steady load."""
    samples: int = 0
    speedup_interval: list[float] = Field(default_factory=list)
    threads: int | None = None


class Timing(_Part):
    candidate: TimeStats
    eager: TimeStats
    compile: TimeStats | None = None
    compile_device: TimeStats | None = None
    """The compiled baseline's device time (cuda): what ``speedup_vs_compile`` divides there."""
    compile_note: str | None = None
    speedup_vs_eager: TimeStats
    speedup_interval: list[float] = Field(default_factory=list)
    """The 95% interval of ``speedup_vs_eager``'s median (order statistics of the paired ratios)."""
    speedup_vs_compile: TimeStats | None = None
    """Against torch.compile's kernels: its device time over the candidate's time on cuda
    (``compile_basis`` "device"), its latency on the cpu ("latency")."""
    compile_basis: str | None = None
    speedup_vs_compile_latency: TimeStats | None = None
    """Against torch.compile's call, guards and wrappers included (what a lone call costs)."""
    noise: float = 0.0
    block_medians_us: list[float] = Field(default_factory=list)
    overhead_us: dict[str, float] | list[float] = Field(default_factory=dict)
    floor_us: float = 0.0
    """The roofline floor the judge applied: ``roofline_floor_us`` without the bounds eager's own
    fastest call beats (``roofline.floor_under``)."""
    roofline_floor_us: float | None = None
    fraction_of_floor: float = 0.0
    resolution_us: float = 0.0
    below_resolution: bool = False
    impossible: bool = False
    checked_timed_runs: int = 0
    eager_off: int = 0
    """Elements of the timed calls where the candidate missed eager's output and the arbiter
    accepted it (nearer the program's float64 result than eager, on the inputs as the judge drew
    them: ``Evaluation.regenerated``)."""
    calls_per_sample: int = 1
    sample_sized_by_us: float | None = None
    """The warm-up's time a call (µs) that set ``calls_per_sample``; None where eager's profiled
    time did (the candidate was not faster than it asked for)."""
    sets_held: int = 1
    """Input sets the runner held: the most calls a sample can make."""
    quiet: bool = True
    noisy_reasons: list[str] = Field(default_factory=list)
    load_notes: list[str] = Field(default_factory=list)
    """Signs of load seen in the attempt that counts, which delayed the verdict but did not deny it."""
    threads_note: str | None = None
    """Why eager and the candidate were timed on fewer threads than configured (a busy machine)."""
    attempts: list[Attempt] = Field(default_factory=list)
    runner_cpu_while_frozen_ns: int = 0
    protocol: dict[str, Any] = Field(default_factory=dict)


class ProfileReport(_Part):
    """Nsight Compute's numbers for one launch (``available``), or why there are none."""

    available: bool = False
    reason: str = ""
    duration_us: float | None = None
    dram_throughput_pct: float | None = None
    sm_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    registers_per_thread: float | None = None
    floor_us: float | None = None
    fraction_of_floor: float | None = None
    kernels: list[dict[str, Any]] = Field(default_factory=list)
    raw_csv: str | None = None
    timeline: dict[str, Any] | None = None
    """Nsight Systems' summary of the call where nsys is installed (evaluator/nsys.py), or why not."""


class EvalResult(_Part):
    """One evaluation of one candidate on one card."""

    schema_version: int = Field(SCHEMA_VERSION, alias="schema")
    status: Status = "error"
    reason: str = ""
    failure: str | None = None
    card: str = ""
    backend: str = ""
    source_sha256: str = ""
    evaluated_at: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    static: StaticReport | None = None
    build: BuildReport | None = None
    correctness: Correctness | None = None
    timing: Timing | None = None
    profile: ProfileReport | None = None
    sanitizer: dict[str, Any] | None = None
    confinement: dict[str, Any] | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    time_us: float | None = None
    seconds: float = 0.0
    seed: int | None = None
    phase: str | None = None
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    runner_pid: int | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    traceback: str | None = None
    log_tail: str | None = None

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants", populate_by_name=True)

    # ---- what callers ask -------------------------------------------------------------------
    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def correct(self) -> bool:
        """Correct on every input set (whether or not its speed could be trusted)."""
        return self.status in ("passed", "noisy")

    # ---- JSON --------------------------------------------------------------------------------
    def to_json(self, indent: int | None = 1) -> str:
        return self.model_dump_json(by_alias=True, indent=indent)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.to_json(indent=None))
        return out

    @classmethod
    def from_json(cls, text: str | bytes) -> "EvalResult":
        return cls.model_validate_json(text)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalResult":
        data = dict(data)
        data.setdefault("schema", 1)  # written before the schema was versioned
        return cls.model_validate(data)


def load_result(raw: bytes | str | None) -> EvalResult | None:
    """A result as stored in git (any schema version); None for none or an unreadable one."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        return EvalResult.from_dict(data)
    except ValueError:
        return None
