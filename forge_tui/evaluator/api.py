"""The evaluator's one entry point: (card, candidate source, options) -> an ``EvalResult``.

The search, the agent's tools, the TUI and ``forge eval`` all call ``Evaluator.evaluate``.

Result ``status``:
  passed        correct on every input set and timed (see ``speedup_vs_eager``)
  rejected      a static rule, a correctness check, or an impossible time (``failure``, ``reason``)
  build_failed  the compiler refused it (``build.diagnostics``)
  noisy         correct on every input set, but the speedup could not be trusted: its interval
                stayed wide, or the load changed during the measurement
                (``timing.noisy_reasons``); no speedup is claimed
  crash         it killed its own process (segfault, abort, illegal memory access, forbidden call)
  timeout       it stopped making progress (endless loop, hang)
  error         the harness itself failed (a bug to report, not the candidate's fault), or the
                candidate could not be confined on this machine
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from ..cards import Card
from ..config import ForgeConfig
from ..tensorstore import TensorStore
from .accused import runner_executable
from .build import Builder, BuildResult
from .request import JudgeOptions, JudgeRequest
from .result import SCHEMA_VERSION, EvalResult
from .static_checks import check_source, errors
from .worker import WorkerClient


@dataclass
class EvalOptions:
    static_checks: bool = True
    timing: bool = True
    profile: bool = False
    sanitize: bool = False
    """Run compute-sanitizer memcheck and initcheck on one call (cuda); errors reject."""
    allow_libraries: bool = False
    adversarial: bool = True
    """Check on the adversarial input sets of the card's kind too (overflow, zeros, tiny, offset,
    NaN and ±inf)."""
    seed: int | None = None
    random_sets: int | None = None
    compile_baseline: bool | Literal["auto"] = "auto"
    near_duplicates: int = 6
    """Calls on near-duplicate inputs (each one element apart from the one before, then the first
    again) that show a kernel keeping state across calls; 0 skips them."""


def _sizes(point: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(point.items()))


def resolve_backend(name: str) -> str:
    if name != "auto":
        return name
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


class Evaluator:
    """Builds in parallel on the CPU cores; runs candidates one at a time per worker process."""

    def __init__(self, store: TensorStore, cache_dir: Path, config: ForgeConfig | None = None, *,
                 backend: str | None = None, arch: str | None = None, worker_env: dict | None = None) -> None:
        cfg = config or ForgeConfig()
        self.timing_cfg = cfg.timing
        self.cfg = cfg.evaluator
        self.backend = resolve_backend(backend or self.cfg.backend)
        self.device = "cuda" if self.backend == "cuda" else "cpu"
        self.store = store
        self.builder = Builder(self.backend, cache_dir, arch=arch, timeout_s=self.cfg.build_timeout_s,
                               parallel=self.cfg.parallel_builds)
        self._runner: Path | None = None
        # The judge gives a candidate's call run_timeout_s; the client waits longer, for the judge.
        limits = {"correctness": self.cfg.run_timeout_s + 30, "timing": self.cfg.run_timeout_s + 30,
                  "load": self.cfg.run_timeout_s + 60}
        self.worker = WorkerClient(self.device, limits=limits, env=worker_env)
        self._closed = False

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self.worker.stop()
            self.builder.close()
            self._closed = True

    def build(self, source: str) -> BuildResult:
        return self.builder.build(source)

    def runner(self) -> Path:
        """The candidate runner executable (built once per machine, cached beside the builds)."""
        if self._runner is None:
            self._runner = runner_executable(self.builder.cache_dir.parent)
        return self._runner

    def _can_run(self) -> str | None:
        if self.device == "cuda":
            try:
                import torch

                if not torch.cuda.is_available():
                    return "the cuda backend needs a CUDA GPU and this machine has none (use the cpu backend)"
            except Exception as exc:  # noqa: BLE001
                return f"torch is not importable: {exc}"
        return None

    def evaluate(self, card: Card, source: str, options: EvalOptions | None = None) -> EvalResult:
        if card.ranges:
            return self._evaluate_range(card, source, options or EvalOptions())
        return self._evaluate(card, source, options)

    def _evaluate_range(self, card: Card, source: str, opt: EvalOptions) -> EvalResult:
        """A range card's candidate: checked at the range's ends and at odd and prime sizes inside
        it (``ranges.size_points``: fresh inputs of those shapes, drawn from the captured inputs'
        value ranges), then timed at the size the profile weighted most, on its captured inputs.
        The first size it fails at is its result, named in the reason; ``detail["range"]`` lists
        the sizes checked and the one timed."""
        from dataclasses import replace

        from ..ranges import at_sizes, heaviest_point, range_reason, size_points

        why = range_reason(card)
        if why is not None:
            t0 = time.perf_counter()
            return self._finish({"status": "rejected", "failure": "range", "reason": f"range: {why}", "card": card.id,
                                 "backend": self.backend}, t0)
        checked: list[dict[str, int]] = []
        for point in size_points(card):
            exact = at_sizes(card, point)
            got = self._evaluate(exact, source, replace(opt, timing=False, profile=False))
            checked.append(point)
            if got.status != "passed":
                return got.model_copy(update={
                    "card": card.id, "reason": f"at sizes {_sizes(point)}: {got.reason}",
                    "detail": {**got.detail, "range": {"checked": checked, "failed_at": point}}})
        top = heaviest_point(card)
        timed = at_sizes(card, top)
        timed = timed.model_copy(update={"samples": [s for s in card.samples if s.point == top],
                                         "flags": [f for f in timed.flags if f != "no_sample"] if any(
                                             s.point == top for s in card.samples) else timed.flags})
        got = self._evaluate(timed, source, opt)
        return got.model_copy(update={"card": card.id,
                                      "detail": {**got.detail, "range": {"checked": checked, "timed_at": top}}})

    def _evaluate(self, card: Card, source: str, options: EvalOptions | None = None) -> EvalResult:
        opt = options or EvalOptions()
        t0 = time.perf_counter()
        result: dict = {
            "status": "error", "reason": "", "failure": None, "card": card.id, "backend": self.backend,
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "evaluated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "options": asdict(opt),
            "static": None, "build": None, "correctness": None, "timing": None, "profile": None,
            "speedup_vs_eager": None, "speedup_vs_compile": None, "time_us": None,
        }
        findings = check_source(source, self.backend, allow_libraries=opt.allow_libraries)
        result["static"] = {"findings": [f.to_json() for f in findings], "enforced": opt.static_checks}
        if opt.static_checks and errors(findings):
            first = errors(findings)[0]
            result.update(status="rejected", failure="static", reason=f"static check: {first}")
            return self._finish(result, t0)
        build = self.builder.build(source)
        result["build"] = build.to_json()
        if not build.ok:
            result.update(status="build_failed", failure="build", reason=build.reason)
            return self._finish(result, t0)
        cannot = self._can_run()
        if cannot:
            result.update(status="error", failure="no_device", reason=cannot)
            return self._finish(result, t0)
        try:
            runner = self.runner()
        except RuntimeError as exc:
            result.update(status="error", failure="harness", reason=str(exc))
            return self._finish(result, t0)
        request = JudgeRequest(
            card=card.model_dump(mode="json"), library=str(build.library), runner=str(runner),
            store=str(self.store.root), device=self.device, timing=self.timing_cfg,
            options=JudgeOptions(seed=opt.seed, random_sets=opt.random_sets or self.cfg.random_sets,
                                 timing=opt.timing, compile_baseline=opt.compile_baseline,
                                 adversarial=opt.adversarial, call_timeout_s=self.cfg.run_timeout_s,
                                 near_duplicates=opt.near_duplicates,
                                 confinement=self.cfg.confinement, landlock=self.cfg.landlock))
        body = self.worker.run(request.model_dump(mode="json"))
        result.update({k: v for k, v in body.items() if k != "seconds"})
        timing = result.get("timing")
        if timing and result["status"] == "passed":
            result["time_us"] = timing["candidate"]["median"]
            result["speedup_vs_eager"] = timing["speedup_vs_eager"]["median"]
            if timing.get("speedup_vs_compile"):
                result["speedup_vs_compile"] = timing["speedup_vs_compile"]["median"]
        if opt.sanitize and result["status"] == "passed" and self.device == "cuda":
            from .sanitizer import sanitize

            report = sanitize(card.model_dump(mode="json"), str(build.library), str(self.store.root))
            result["sanitizer"] = report
            if report.get("errors"):
                bad = [f"{tool}: {t['errors']} errors" for tool, t in report["tools"].items() if t.get("errors")]
                result.update(status="rejected", failure="sanitizer", reason="compute-sanitizer " + ", ".join(bad))
        if opt.profile and result["status"] == "passed":
            result["profile"] = self.profile(card, build, timing)
        return self._finish(result, t0)

    def profile(self, card: Card, build: BuildResult, timing: dict | None) -> dict:
        """Nsight Compute's report on one launch, and where nsys is installed the timeline summary
        of the call (``timeline``: the kernels it launches, how often and how long)."""
        from . import ncu, nsys

        if self.device != "cuda":
            return ncu.unavailable("Nsight Compute and Nsight Systems profile CUDA kernels; this is the cpu backend")
        from .. import roofline

        ceil = roofline.ceilings("cuda")
        floor = timing["floor_us"] if timing else None
        card_json = card.model_dump(mode="json")
        report = ncu.profile(card_json, str(build.library), str(self.store.root), floor_us=floor,
                             bandwidth_Bps=ceil["bandwidth_Bps"])
        report["timeline"] = nsys.timeline(card_json, str(build.library), str(self.store.root))
        return report

    @staticmethod
    def _finish(result: dict, t0: float) -> EvalResult:
        result["seconds"] = time.perf_counter() - t0
        result["schema"] = SCHEMA_VERSION
        return EvalResult.model_validate(result)
