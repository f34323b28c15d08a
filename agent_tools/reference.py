"""Tools for the reference-writing conversation (``forge new``): ``try_reference`` and its ``submit``.

``try_reference`` runs the conversation's ``reference.py`` in a separate, confined process and
reports what it did: ``python -I -B -c CHILD`` with a scrubbed environment (no API key, no secret:
only PATH, LD_LIBRARY_PATH, the locale and an empty CUDA_VISIBLE_DEVICES), its working directory
the conversation's, a wall-time limit (the whole process group is killed past it) and an
address-space limit (``RLIMIT_AS``). This process is made non-dumpable first, so no process of the
user can read its memory or its /proc/PID/environ (where the API key is). The child restricts its
reads with Landlock (``forge_tui.evaluator.jail``: its folder, Python and its packages, the
system's libraries, its own /proc entry; nothing else, not /etc/passwd nor the parent's /proc)
and drops every capability before it imports torch, then installs on itself the evaluator's
seccomp deny filter (``forge_tui.evaluator.confine.build_filter``: no new processes or programs,
no network, no file opened for writing or created, no signal to another process), and only then
runs ``reference.py``, read without following a link and checked against the hash it was tried
under. It calls ``example_inputs(device="cpu")`` twice (the inputs
must be seeded) and ``reference(*inputs)`` twice (it must be deterministic and leave its inputs
alone), and reports the inputs' and outputs' shapes, dtypes, strides and value statistics, or the
traceback of what failed (naming a refusal of the sandbox as such).

The child writes its report (JSON) on its standard output; the reference's own prints go to its
standard error, of which the model sees the end.

``submit`` takes a one-paragraph summary and hands the reference back to the caller, but only once
``try_reference`` passed on the file as it is now (the harness never takes an untried reference).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from forge_tui import safeio
from forge_tui.evaluator.jail import PYTHON_SYSTEM_READ

from .base import Params, Submission, Tool, ToolEnv, ToolError
from .files import read_text

REFERENCE_FILE = "reference.py"
WALL_S = 120.0
ADDRESS_SPACE_BYTES = 16 << 30
"""The child's address-space limit: torch alone maps about 1 GiB; a (8192, 4096) fp32 tensor is 128 MiB."""
MAX_SUMMARY_CHARS = 2000
STDERR_TAIL = 2000


def confine_py() -> Path:
    """The evaluator's confine.py, which the child loads by path (not the forge_tui.evaluator package)."""
    from importlib import resources

    return Path(str(resources.files("forge_tui") / "evaluator" / "confine.py"))


def jail_py() -> Path:
    """The evaluator's jail.py (Landlock, capabilities), loaded by path like confine.py."""
    return confine_py().with_name("jail.py")


# The child: argv = [-c, confine.py, jail.py, address-space bytes, confine (1/0), the reference's
# file name, its sha256, the folders it may read (JSON)].
CHILD = r'''
import json, os, sys, time, traceback
report_fd = os.dup(1)
os.dup2(2, 1)  # the reference's prints go to stderr; stdout carries only the report
report = {"ok": False, "stage": "start", "problems": [], "warnings": [], "confined": False}


def finish():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    data = json.dumps(report, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(report_fd, view):]
    os._exit(0)


def failed(stage):
    report["stage"] = stage
    exc = sys.exc_info()[1]
    te = traceback.TracebackException(*sys.exc_info())
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not f.filename.startswith(("<string>", "<frozen"))])
    text = "".join(te.format())
    report["error"] = text if len(text) <= 8000 else "[...]\n" + text[-8000:]
    refused = False
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (1, 13):
            refused = True
        exc = exc.__cause__ or exc.__context__
    report["refused"] = refused
    finish()


confine_py, jail_py, as_bytes, confine = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
ref_name, ref_sha, readable = sys.argv[5], sys.argv[6], json.loads(sys.argv[7])


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


try:
    import hashlib
    import importlib.util
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    if confine:
        # the filter is built now (libseccomp is found through ldconfig and a temporary folder)
        # and loaded once torch is in
        seccomp_filter = load("_forge_confine", confine_py).build_filter(os.getpid())
        jail = load("_forge_jail", jail_py)
        # reads: this folder, Python and its packages (torch), the system's libraries, this
        # process's own /proc entry; before torch starts a thread, so every thread is confined
        own = [p for p in {*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix} if p]
        rules = [(jail.READ_EXEC, p) for p in own + readable] + [(jail.READ, os.getcwd()),
                                                                  (jail.READ, f"/proc/{os.getpid()}")]
        try:
            report["landlock"] = jail.landlock(rules)
        except OSError as exc:
            if exc.errno != 38:  # ENOSYS: a kernel without Landlock keeps the other defences
                raise
            report["landlock"] = f"landlock unavailable ({exc.strerror})"
        jail.drop_capabilities()
    import torch
    report["torch"] = torch.__version__
    if confine:
        seccomp_filter.load()
        report["confined"] = True
except BaseException:
    failed("sandbox")

try:
    # the reference as it was hashed and tried, opened without following a link
    fd = os.open(ref_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        code = f.read()
    if hashlib.sha256(code).hexdigest() != ref_sha:
        raise RuntimeError(f"{ref_name} changed while it was being tried")
    ref = type(sys)("reference")
    ref.__file__ = os.path.join(os.getcwd(), ref_name)
    sys.modules["reference"] = ref
    exec(compile(code, ref.__file__, "exec"), ref.__dict__)
except BaseException:
    failed("import")
for name in ("reference", "example_inputs"):
    if not callable(getattr(ref, name, None)):
        report["stage"] = "import"
        report["problems"].append(f"{ref_name} defines no function {name}()")
if report["problems"]:
    finish()


def describe(t):
    d = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "stride": list(t.stride()),
         "device": t.device.type, "contiguous": t.is_contiguous()}
    if t.numel() == 0:
        return d
    x = t.detach()
    if x.is_complex():
        return d
    if x.dtype.is_floating_point:
        x64 = x.to("cpu", torch.float64)
        nan = int(torch.isnan(x64).sum())
        inf = int(torch.isinf(x64).sum())
        fin = x64[torch.isfinite(x64)]
        d.update(nan=nan, inf=inf)
        if fin.numel():
            d.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()),
                     std=float(fin.std()) if fin.numel() > 1 else 0.0)
    else:
        x64 = x.to("cpu", torch.float64)
        d.update(min=float(x64.min()), max=float(x64.max()), mean=float(x64.mean()))
    return d


def same(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


def tensors(value, what):
    if isinstance(value, torch.Tensor):
        return [value], "tensor"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value), "tuple"
    report["problems"].append(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}"
                              + (f" holding {', '.join(sorted({type(v).__name__ for v in value}))}"
                                 if isinstance(value, (list, tuple)) else ""))
    return None, ""


try:
    raw = ref.example_inputs(device="cpu")
except BaseException:
    failed("example_inputs")
if not isinstance(raw, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in raw):
    report["stage"] = "example_inputs"
    kinds = ", ".join(sorted({type(v).__name__ for v in raw})) if isinstance(raw, (list, tuple)) else type(raw).__name__
    report["problems"].append(f"example_inputs() must return a list of tensors, got {kinds}")
    finish()
inputs = list(raw)
report["inputs"] = [describe(t) for t in inputs]
try:
    again = list(ref.example_inputs(device="cpu"))
    report["seeded"] = len(again) == len(inputs) and all(same(a, b) for a, b in zip(inputs, again))
except BaseException:
    failed("example_inputs")
if not report["seeded"]:
    report["problems"].append("two calls of example_inputs() gave different tensors: seed them "
                              "(torch.Generator().manual_seed(0), or torch.manual_seed(0) first)")
keep = [t.clone() for t in inputs]
try:
    with torch.no_grad():
        t0 = time.perf_counter()
        out = ref.reference(*inputs)
        report["seconds"] = time.perf_counter() - t0
except BaseException:
    failed("call")
outs, report["returns"] = tensors(out, "reference(*inputs)")
if outs is None:
    report["stage"] = "outputs"
    finish()
report["outputs"] = [describe(t) for t in outs]
changed = [k for k, (a, b) in enumerate(zip(inputs, keep)) if not same(a, b)]
if changed:
    report["problems"].append("reference() changed its inputs " + ", ".join(f"[{k}]" for k in changed)
                              + ": it must be a pure function (no in-place ops on its arguments)")
aliased = [k for k, o in enumerate(outs) if any(o.data_ptr() == t.data_ptr() and o.numel() for t in inputs)]
if aliased:
    report["problems"].append("output " + ", ".join(f"[{k}]" for k in aliased) + " is one of the inputs "
                              "(or a view of one): return a computed tensor")
try:
    with torch.no_grad():
        out2 = ref.reference(*[t.clone() for t in keep])
except BaseException:
    failed("call")
outs2, _ = tensors(out2, "the second call of reference(*inputs)")
if outs2 is not None:
    agree = len(outs2) == len(outs) and all(same(a, b) for a, b in zip(outs, outs2))
    report["deterministic"] = agree
    if not agree:
        report["problems"].append("two calls of reference() on the same inputs disagree: it must be "
                                  "deterministic (no random numbers, no dropout)")
for k, d in enumerate(report["outputs"]):
    if d.get("nan") or d.get("inf"):
        report["warnings"].append(f"output [{k}] holds {d.get('nan', 0)} NaN and {d.get('inf', 0)} inf "
                                  "on the example inputs")
report["stage"] = "done"
report["ok"] = not report["problems"]
finish()
'''


# ---- the report --------------------------------------------------------------------------------
@dataclass
class ReferenceReport:
    """What one run of ``reference.py`` showed."""

    ok: bool
    stage: str
    """Where it stopped: sandbox, import, example_inputs, call, outputs, done, timeout, crashed."""
    error: str = ""
    """The traceback (or why the process died)."""
    refused: bool = False
    """The sandbox refused a system call on the way to the error."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    returns: str = ""
    seeded: bool | None = None
    deterministic: bool | None = None
    seconds: float | None = None
    torch: str = ""
    confined: bool = False
    landlock: str = ""
    """What confined its reads ("landlock ABI 7"), or why nothing did."""
    stderr: str = ""
    source_sha256: str = ""
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReferenceReport":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def text(self, file: str = REFERENCE_FILE) -> str:
        """The report as the model (and ``forge new``) reads it."""
        where = {"sandbox": "while setting up the sandbox", "import": f"while importing {file}",
                 "example_inputs": "in example_inputs()", "call": "in reference(*inputs)",
                 "outputs": "on the outputs of reference(*inputs)", "timeout": "", "crashed": ""}.get(self.stage, "")
        cage = "NOT confined"
        if self.confined:
            reads = ("reads confined by " + self.landlock) if self.landlock.startswith("landlock ABI") else "reads not confined"
            cage = f"confined (seccomp, {reads})"
        head = f"try_reference {file}: " + ("OK" if self.ok else "FAILED" + (f" {where}" if where else ""))
        head += f" ({'torch ' + self.torch + ', ' if self.torch else ''}{cage}, {self.wall_s:.1f} s in all)"
        lines = [head]
        if self.stage in ("timeout", "crashed"):
            lines.append(self.error)
        if self.inputs:
            seeded = {True: "seeded: two calls give the same tensors", False: "NOT seeded: two calls differ",
                      None: ""}[self.seeded]
            lines.append(f'example_inputs(device="cpu"): {len(self.inputs)} tensor{"s" if len(self.inputs) != 1 else ""}'
                         + (f", {seeded}" if seeded else ""))
            lines.extend(f"  [{k}] {tensor_line(d)}" for k, d in enumerate(self.inputs))
        if self.outputs:
            what = "one tensor" if self.returns == "tensor" else f"a tuple of {len(self.outputs)} tensors"
            took = f" in {1000 * self.seconds:.1f} ms" if self.seconds is not None else ""
            lines.append(f"reference(*inputs) returns {what}{took}:")
            lines.extend(f"  [{k}] {tensor_line(d)}" for k, d in enumerate(self.outputs))
        if self.deterministic is not None:
            lines.append("deterministic: two calls agree bit for bit" if self.deterministic
                         else "NOT deterministic: two calls on the same inputs disagree")
        for p in self.problems:
            lines.append(f"problem: {p}")
        for w in self.warnings:
            lines.append(f"warning: {w}")
        if self.error and self.stage not in ("timeout", "crashed"):
            lines.append(self.error.rstrip())
        if self.refused:
            lines.append("the sandbox refused a system call: a reference must be a pure computation on tensors "
                         "(no files written or read outside its folder, no network, no new processes)")
        if self.stderr.strip():
            lines.append("its output (stdout and stderr, the end):\n" + self.stderr.strip()[-STDERR_TAIL:])
        return "\n".join(lines)


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def tensor_line(d: dict[str, Any]) -> str:
    shape, stride = str(tuple(d.get("shape", []))), str(tuple(d.get("stride", [])))
    out = f"{d.get('dtype')} shape {shape} stride {stride}" + ("" if d.get("contiguous", True) else " (NOT contiguous)")
    if "min" in d:
        out += f"; min {_num(d['min'])}, max {_num(d['max'])}, mean {_num(d['mean'])}"
        if "std" in d:
            out += f", std {_num(d['std'])}"
    if d.get("nan") or d.get("inf"):
        out += f"; {d.get('nan', 0)} NaN, {d.get('inf', 0)} inf"
    return out


# ---- running it ---------------------------------------------------------------------------------
def scrubbed_env(workdir: Path) -> dict[str, str]:
    """The child's whole environment: nothing secret, nothing that changes Python or torch."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
           "HOME": str(workdir), "CUDA_VISIBLE_DEVICES": ""}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def run_reference(workdir: Path, *, file: str = REFERENCE_FILE, wall_s: float = WALL_S,
                  address_space_bytes: int = ADDRESS_SPACE_BYTES, confine: bool = True,
                  python: str = sys.executable) -> ReferenceReport:
    """Run ``workdir/file`` in a confined child and report (never raises for what the reference does)."""
    workdir = Path(workdir).resolve()
    try:
        sha = hashlib.sha256(safeio.read_bytes(workdir, file)[1]).hexdigest()
    except safeio.Refused:
        sha = ""  # a link or no file: what runs cannot be the file a submit would take
    if confine:
        from forge_tui.evaluator.jail import not_dumpable

        not_dumpable()  # the child cannot read this process's memory or /proc/PID/environ (the API key)
    t0 = time.monotonic()
    proc = subprocess.Popen([python, "-I", "-B", "-c", CHILD, str(confine_py()), str(jail_py()),
                             str(int(address_space_bytes)), "1" if confine else "0", file, sha,
                             json.dumps(list(PYTHON_SYSTEM_READ))],
                            cwd=workdir, env=scrubbed_env(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=wall_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        return ReferenceReport(ok=False, stage="timeout", source_sha256=sha, wall_s=time.monotonic() - t0,
                               error=f"stopped: the reference ran past the {wall_s:g} s wall-time limit "
                                     "(an endless loop, or far too much work for the example inputs)",
                               stderr=err.decode(errors="replace")[-STDERR_TAIL:], confined=confine)
    finally:
        _kill(proc)
    wall = time.monotonic() - t0
    stderr = err.decode(errors="replace")[-STDERR_TAIL:]
    try:
        data = json.loads(out.decode(errors="replace"))
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        why = (f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}")
        hint = (" (out of memory: the address-space limit is "
                f"{address_space_bytes / (1 << 30):.0f} GiB)" if proc.returncode == -signal.SIGKILL else "")
        return ReferenceReport(ok=False, stage="crashed", source_sha256=sha, wall_s=wall, stderr=stderr,
                               error=f"the process running the reference died before reporting ({why}){hint}",
                               confined=confine)
    rep = ReferenceReport.from_json(data)
    rep.stderr, rep.source_sha256, rep.wall_s = stderr, sha, wall
    return rep


def _kill(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# ---- the tools ----------------------------------------------------------------------------------
@dataclass
class ReferenceEnv(ToolEnv):
    """The conversation's ToolEnv, with the limits of ``try_reference`` and its last report."""

    wall_s: float = WALL_S
    address_space_bytes: int = ADDRESS_SPACE_BYTES
    confine: bool = True
    last_report: ReferenceReport | None = None
    reports: int = 0


class TryParams(Params):
    pass


def try_reference(env: ToolEnv, p: TryParams) -> str:
    if not isinstance(env, ReferenceEnv):
        raise ToolError("try_reference is not available in this session")
    read_text(env, REFERENCE_FILE)  # refuses a missing file, a link, a binary (with the reason)
    rep = run_reference(env.workdir, wall_s=env.wall_s, address_space_bytes=env.address_space_bytes,
                        confine=env.confine)
    env.last_report = rep
    env.reports += 1
    return rep.text()


class SubmitReferenceParams(Params):
    summary: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS,
                         description="What the reference computes and what its example inputs are (shapes, "
                                     "dtypes), in a few lines: the user reads it before approving the card.")


def submit_reference(env: ToolEnv, p: SubmitReferenceParams) -> str:
    if not isinstance(env, ReferenceEnv):
        raise ToolError("submit is not available in this session")
    summary = p.summary.strip()
    if not summary:
        raise ToolError("summary is empty: say what the reference computes and what its inputs are")
    _, source = read_text(env, REFERENCE_FILE)
    rep = env.last_report
    sha = hashlib.sha256(source.encode()).hexdigest()
    if rep is None or rep.source_sha256 != sha:
        raise ToolError(f"{REFERENCE_FILE} has not been tried as it is now: call try_reference, fix what it "
                        "reports, then submit")
    if not rep.ok:
        raise ToolError(f"the last try_reference of {REFERENCE_FILE} failed: fix what it reported, try it again, "
                        "then submit")
    again = env.submission is not None
    env.submission = Submission(source=source, move=summary.splitlines()[0][:200], file=REFERENCE_FILE, notes=summary)
    return (f"submitted {REFERENCE_FILE} ({len(source.encode())} bytes)" + (" (replaces the earlier submission)" if again
                                                                             else "")
            + "; the user reviews it before it becomes a card")


TRY_REFERENCE = Tool("try_reference", f"Run {REFERENCE_FILE} in a sandbox (no files written, none read outside "
                     'its folder, no network, no new processes; CPU only): example_inputs(device="cpu") twice, reference(*inputs) twice. Reports '
                     "the inputs' and outputs' shapes, dtypes, strides and value statistics, whether the inputs are "
                     "seeded and the reference deterministic, or the traceback of what failed.",
                     TryParams, try_reference)
SUBMIT_REFERENCE = Tool("submit", f"Hand {REFERENCE_FILE} to the user for approval, with a short summary. Only a "
                        "reference whose last try_reference passed, unchanged since, is accepted.",
                        SubmitReferenceParams, submit_reference)
