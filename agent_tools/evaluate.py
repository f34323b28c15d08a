"""Evaluator tools: compile, run_tests, profile and submit, on the session's ``EvalPool``.

Each reads a source file of the working directory (through the confined file tools), asks the
pool, waits at most ``ToolEnv.timeout_s`` and answers in text the model acts on: compiler
diagnostics each with the offending source line, the static findings the judge would refuse, per
input set ok or the first mismatching elements (got and expected), the timing with its spread,
and Nsight Compute's report or why there is none. ``submit`` only records the kernel
(``ToolEnv.submission``); the caller judges it.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any, Sequence, TypeVar

from pydantic import Field

from forge_tui.evaluator.report import format_result
from forge_tui.evaluator.result import BuildReport, Diagnostic, EvalResult, Finding
from forge_tui.kernel_abi import SOURCE_NAMES

from .base import Params, Submission, Tool, ToolEnv, ToolError
from .files import read_text

if TYPE_CHECKING:
    from concurrent.futures import Future

    from forge_tui.cards import Card
    from forge_tui.search.pool import EvalPool

MAX_DIAGNOSTICS = 20
MAX_MOVE_CHARS = 200
MAX_NOTES_CHARS = 4000
T = TypeVar("T")


def _pool(env: ToolEnv, tool: str) -> "EvalPool":
    if env.pool is None:
        raise ToolError(f"{tool} needs the evaluator, and none is attached to this session")
    return env.pool


def _card(env: ToolEnv, tool: str) -> "Card":
    if env.card is None:
        raise ToolError(f"{tool} needs a card (the operation to match), and this session has none")
    return env.card


def _wait(env: ToolEnv, fut: "Future[T]", what: str) -> T:
    try:
        return fut.result(timeout=env.timeout_s)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise ToolError(f"the evaluator did not answer in {env.timeout_s:g} s ({what})") from None
    except concurrent.futures.CancelledError:
        raise ToolError(f"the evaluator cancelled the request ({what})") from None
    except Exception as exc:  # noqa: BLE001 - the pool's failure, told to the model
        raise ToolError(f"the evaluator failed ({what}): {type(exc).__name__}: {exc}") from None


def _source(env: ToolEnv, file: str | None) -> tuple[str, str]:
    rel, text = read_text(env, file or env.source_name)
    if not text.strip():
        raise ToolError(f"{rel} is empty")
    return rel, text


def _backend(env: ToolEnv) -> str:
    return env.pool.backend if env.pool is not None else env.backend


# ---- formatting -------------------------------------------------------------------------------
def _source_line(lines: Sequence[str], line: int | None, column: int | None = None) -> list[str]:
    if line is None or not 1 <= line <= len(lines):
        return []
    text = lines[line - 1].rstrip("\r")
    out = [f"    {line:>5} | {text}"]
    if column is not None and 1 <= column <= len(text) + 1:
        pad = "".join(c if c == "\t" else " " for c in text[: column - 1])
        out.append(f"          | {pad}^")
    return out


def _is_candidate_file(name: str) -> bool:
    return name in SOURCE_NAMES.values()  # what the builder names the source it compiles


def format_diagnostics(diags: Sequence[Diagnostic], source: str, file: str) -> list[str]:
    """Each diagnostic as file:line:col: severity: message, followed by the line of the source it
    points at (the builder's candidate file is shown under the model's name for it)."""
    lines = source.split("\n")
    shown = list(diags)
    if len(shown) > MAX_DIAGNOSTICS:
        shown = [d for d in shown if d.severity != "note"]
    out: list[str] = []
    for d in shown[:MAX_DIAGNOSTICS]:
        mine = _is_candidate_file(d.file)
        out.append("  " + str(d.model_copy(update={"file": file}) if mine else d))
        if mine:
            out.extend(_source_line(lines, d.line, d.column))
    if len(diags) > len(shown[:MAX_DIAGNOSTICS]):
        out.append(f"  [... {len(diags) - len(shown[:MAX_DIAGNOSTICS])} more diagnostics not shown]")
    return out


def format_findings(findings: Sequence[Finding], source: str) -> list[str]:
    lines = source.split("\n")
    out: list[str] = []
    for f in findings:
        out.append(f"  {'line ' + str(f.line) + ': ' if f.line else ''}{f.severity}: {f.message} [{f.rule}]")
        out.extend(_source_line(lines, f.line))
    return out


def static_findings(source: str, backend: str) -> list[Finding]:
    from forge_tui.evaluator.static_checks import check_source

    return [Finding(rule=f.rule, severity=f.severity, message=f.message, line=f.line)
            for f in check_source(source, backend)]


def _static_section(source: str, backend: str) -> list[str]:
    try:
        findings = static_findings(source, backend)
    except Exception as exc:  # noqa: BLE001 - the parser missing is no reason to hide the compile
        return [f"static checks unavailable: {type(exc).__name__}: {exc}"]
    if not findings:
        return ["static checks (what the evaluator refuses before running a kernel): none"]
    out = ["static checks (what the evaluator refuses before running a kernel):", *format_findings(findings, source)]
    if any(f.severity == "error" for f in findings):
        out.append("  the evaluator rejects this source until the errors above are fixed")
    return out


def _first_mismatches(items: Any) -> list[str]:
    if not isinstance(items, list) or not items:
        return []
    out = ["        first mismatches (index: got, expected):"]
    for m in items:
        if not isinstance(m, dict):
            continue
        idx = ", ".join(str(i) for i in m.get("index", []))
        out.append(f"          [{idx}]: got {_value(m.get('got'))}, expected {_value(m.get('expected'))}")
    return out


def _value(v: Any) -> str:
    return f"{v:.8g}" if isinstance(v, float) else str(v)


def _failure(b: BuildReport) -> str:
    n = len(b.errors)
    if n:
        return f" with {n} error{'s' if n > 1 else ''}:"
    return f": {b.reason or 'the compiler refused it'}"


def _build_failure(b: BuildReport, source: str, file: str) -> list[str]:
    if b.diagnostics:
        return format_diagnostics(b.diagnostics, source, file)
    if b.log.strip():
        return ["compiler output (end):", b.log.strip()[-3000:]]
    return []


def format_tests(r: EvalResult, source: str, file: str) -> str:
    """A check's result (correctness only): per input set ok, or the failure with its first
    mismatching elements."""
    head = f"run_tests {file} on card {r.card}: "
    c = r.correctness
    if r.correct and c is not None:
        lines = [head + f"PASSED: correct on all {len(c.sets)} input sets (not timed: profile times it)"]
        for s in c.sets:
            note = f" ({s.determinism}" + (", a constant output would also pass this set" if s.degenerate else "") + ")"
            lines.append(f"  ok    {s.name}{note}")
        if c.degenerate_card:
            lines.append("  note: a constant output passes every set of this card: its checks prove little")
        return "\n".join(lines)
    lines = [head + f"FAILED ({r.status}" + (f": {r.failure}" if r.failure else "") + ")"]
    if r.status == "build_failed":
        b = r.build
        if b is None:
            lines.append(f"  the build failed: {r.reason}")
        else:
            lines.append("  the build failed" + _failure(b))
            lines.extend(_build_failure(b, source, file))
        return "\n".join(lines)
    if r.failure == "static" and r.static is not None:
        lines.append("  refused by the static checks before it ran:")
        lines.extend(format_findings([f for f in r.static.findings if f.severity == "error"], source))
        return "\n".join(lines)
    detail = r.detail or {}
    for name in detail.get("sets_passed") or []:
        lines.append(f"  ok    {name}")
    if "where" in detail and "message" in detail:
        lines.append(f"  FAIL  {detail['where']}: output {detail.get('output', 0)}: {detail['message']}"
                     + (f" (compared with {detail['compared_with']})" if detail.get("compared_with") else ""))
        lines.extend(_first_mismatches(detail.get("first_mismatches")))
    else:
        lines.append(f"  FAIL  {r.reason or r.status}")
    if r.log_tail:
        lines.append("  log: " + r.log_tail.strip()[-1500:])
    lines.append("  (the checks stop at the first failure: later input sets did not run)")
    return "\n".join(lines)


def format_profile(r: EvalResult) -> str:
    lines = [format_result(r)]
    p = r.profile
    if p is None:
        lines.append(f"profiler unavailable: the kernel was not profiled because it did not pass ({r.status})")
    elif not p.available:
        if not p.reason.startswith("profiler unavailable"):
            lines.append(f"profiler unavailable: {p.reason or 'no reason given'}")
    else:
        lines.append("Nsight Compute report:")
        extra = p.model_extra or {}
        for key in ("achieved_bandwidth_Bps", "bandwidth_fraction", "roofline_fraction", "local_memory_bytes",
                    "shared_bytes_per_block", "dram_bytes"):
            if extra.get(key) is not None:
                lines.append(f"  {key}: {_value(extra[key])}")
        lines += _kernel_lines(p.kernels)
    if p is not None:
        lines += format_timeline(p.timeline)
    return "\n".join(lines)


def format_timeline(t: dict | None) -> list[str]:
    """Nsight Systems' summary of the call (evaluator/nsys.py), or why there is none."""
    if not t:
        return []
    if not t.get("available"):
        return [f"Nsight Systems timeline unavailable: {t.get('reason') or 'no reason given'}"]
    return [f"Nsight Systems timeline: {_value(t.get('launches_per_call'))} kernel launches a call",
            *_kernel_lines(t.get("kernels", []))]


def _kernel_lines(kernels: list[dict[str, Any]]) -> list[str]:
    """One line a kernel: its name, then every metric it has."""
    return [f"  kernel {k.get('kernel', '?')}: "
            + ", ".join(f"{name} {_value(v)}" for name, v in k.items() if name != "kernel" and v is not None)
            for k in kernels]


# ---- the tools --------------------------------------------------------------------------------
class FileParams(Params):
    file: str | None = Field(None, description="Source file in the working directory (default: the candidate, "
                             "candidate.cu on CUDA or candidate.cpp on the CPU).")


def compile_tool(env: ToolEnv, p: FileParams) -> str:
    pool = _pool(env, "compile")
    file, source = _source(env, p.file)
    b = _wait(env, pool.build(source), f"compile of {file}")
    lines: list[str] = []
    if b.ok:
        lines.append(f"compile {file}: ok in {b.seconds:.2f} s" + (" (cached)" if b.cached else ""))
        warnings = [d for d in b.diagnostics if d.severity != "note"]
        if warnings:
            lines.append("compiler warnings:")
            lines.extend(format_diagnostics(warnings, source, file))
        for kernel, res in b.resources.items():
            parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in res.items())
            lines.append(f"  {kernel}: {parts}")
    else:
        lines.append(f"compile {file}: FAILED" + _failure(b))
        lines.extend(_build_failure(b, source, file))
    lines.extend(_static_section(source, _backend(env)))
    return "\n".join(lines)


def run_tests(env: ToolEnv, p: FileParams) -> str:
    pool = _pool(env, "run_tests")
    card = _card(env, "run_tests")
    file, source = _source(env, p.file)
    r = _wait(env, pool.check(card, source), f"tests of {file}")
    env.last_result = r
    return format_tests(r, source, file)


def profile(env: ToolEnv, p: FileParams) -> str:
    pool = _pool(env, "profile")
    card = _card(env, "profile")
    file, source = _source(env, p.file)
    r = _wait(env, pool.profile(card, source), f"profile of {file}")
    env.last_result = r
    return f"profile {file}:\n" + format_profile(r)


class SubmitParams(Params):
    move: str = Field(min_length=1, max_length=MAX_MOVE_CHARS,
                      description="One line: what this kernel changes (e.g. 'one pass online softmax, 4 rows per block').")
    file: str | None = Field(None, description="The source to submit (default: the candidate file).")
    notes: str = Field("", max_length=MAX_NOTES_CHARS, description="Anything the next attempt should know.")


def submit(env: ToolEnv, p: SubmitParams) -> str:
    move = p.move.strip()
    if not move:
        raise ToolError("move is empty: say in one line what this kernel changes")
    if "\n" in move or "\r" in move:
        raise ToolError("move must be one line: put the rest in notes")
    file, source = _source(env, p.file)
    again = env.submission is not None
    env.submission = Submission(source=source, move=move, file=file, notes=p.notes.strip())
    return (f"submitted {file} ({len(source.encode())} bytes): {move}"
            + (" (replaces the earlier submission)" if again else "") + "; the evaluator judges it after this attempt")


COMPILE = Tool("compile", "Compile a source file (no run): ok with build time and per-kernel registers/spills, or "
               "each compiler diagnostic with its source line; also lists the static checks the evaluator "
               "would refuse.", FileParams, compile_tool)
RUN_TESTS = Tool("run_tests", "Check a kernel's correctness against the reference on every input set (captured, "
                 "random, adversarial), without timing: ok per set, or the failing set with its first "
                 "mismatching elements (index, got, expected).", FileParams, run_tests)
PROFILE = Tool("profile", "Full evaluation of a kernel: correctness, timing with spread, speedup vs eager and "
               "torch.compile, and the Nsight Compute report (CUDA) or why there is none.", FileParams, profile)
SUBMIT = Tool("submit", "Submit a kernel as this attempt's result, with one line saying what it changes "
              "(a later submit replaces it).", SubmitParams, submit)
