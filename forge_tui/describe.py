"""Kernels from a description (``forge new``): the LLM agent writes a PyTorch reference and example
inputs for an operation described in a sentence; once a person approves them they become a card.

    draft = draft_reference("fused LayerNorm + GELU for (8192, 4096) bf16", config, workdir=tmp)
    print(draft.text())                        # the reference, its inputs, the sandbox's report
    if draft.ok and approved:
        made = accept(draft, "workspaces/ln_gelu")   # a workspace holding the card
    draft.discard()

``draft_reference`` holds one conversation through the agent's loop (``agent/loop.py``: the same
limits, the ledger with the run's money cap, the transcript written after every step with every
secret redacted) with the prompts ``prompts/new_system.md`` and ``prompts/new_task.md`` and the
toolset ``agent_tools.reference_tools()``: the file tools, ``try_reference`` (which runs the file in
a confined child process) and ``submit`` (which takes the reference only once ``try_reference``
passed on it as it is). The conversation's files are in ``<workdir>/work/``, its transcript in
``<workdir>/transcript.jsonl``.

``accept`` wraps ``reference`` in a leaf module named after the description (``workload.py``,
which loads ``reference.py`` beside it) and profiles it, in a confined child process
(``profile_confined``: the reference never runs in forge's own process), into a workspace
(``funcards.py``): a new
workspace whose one card is that module (or its single op), or a card added to an existing one.
The workspace keeps, committed on ``main``, ``reference.py``, ``workload.py`` and the conversation
(``draft/transcript.jsonl`` and ``draft/draft.json``: the description, the model, the summary, the
cost, who approved it); a card added to an existing workspace keeps the same under
``references/<card id>/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import safeio
from .config import ForgeConfig
from .errors import ForgeError
from .gitrepo import refuse_secrets
from .redaction import redact as redact_environment

if TYPE_CHECKING:
    from agent_tools.reference import ReferenceReport

    from .agent.loop import Outcome
    from .agent.messages import Provider
    from .funcards import CardWorkspace

WORK = "work"
"""The conversation's files, under its working directory (the tools see only this folder)."""
REFERENCE = "reference.py"
TRANSCRIPT_BYTES = 256 << 20
"""A conversation's transcript larger than this is not committed."""


@dataclass
class Draft:
    """What a reference-writing conversation produced."""

    description: str
    name: str
    """The module class the reference becomes (from the description)."""
    source: str
    """``reference.py`` as submitted (or as left, when the conversation ended without a submission)."""
    summary: str
    """What the model said the reference computes, at submit."""
    report: "ReferenceReport | None"
    """The try_reference run of the submitted source (None without a submission)."""
    transcript: list[dict[str, Any]]
    transcript_path: Path
    workdir: Path
    cost_usd: float
    outcome: "Outcome"
    provider: str = ""
    model: str = ""
    submitted: bool = False
    notes: list[str] = field(default_factory=list)
    redact: Callable[[str], str] = field(default=redact_environment, repr=False)
    """Hides the environment's secrets (and the configured key's) in what is printed."""

    @property
    def ok(self) -> bool:
        """A reference the sandbox ran cleanly, submitted by the model: it can become a card."""
        return self.submitted and self.report is not None and self.report.ok and bool(self.source.strip())

    @property
    def why_not(self) -> str:
        """Why the draft cannot become a card ("" when it can)."""
        if self.ok:
            return ""
        if not self.submitted:
            return f"the agent submitted no reference ({self.outcome.reason})" + "".join(f"; {n}" for n in self.notes)
        return "the submitted reference does not pass try_reference"

    def inputs_text(self) -> str:
        """The example inputs, as a person reads them."""
        rep = self.report
        if rep is None or not rep.inputs:
            return "(not known: the reference was not run)"
        from agent_tools.reference import tensor_line

        return "\n".join(f"[{k}] {tensor_line(d)}" for k, d in enumerate(rep.inputs))

    def text(self) -> str:
        """The draft as ``forge new`` prints it: the reference, the summary, the sandbox's report."""
        lines = [f"# {self.description}", f"# {REFERENCE}, written by {self.provider} {self.model} "
                 f"(${self.cost_usd:.4f}, {self.outcome.queries} queries, {self.outcome.tool_calls} tool calls)",
                 self.source.rstrip() or "(empty)", ""]
        if self.summary:
            lines += ["# summary", self.summary, ""]
        if self.report is not None:
            lines += ["# try_reference", self.report.text()]
        return self.redact("\n".join(lines))

    def discard(self) -> None:
        """Remove the conversation's working directory (after ``accept``, or on refusal)."""
        shutil.rmtree(self.workdir, ignore_errors=True)


def _agent_parts(config: ForgeConfig, provider: "Provider | None",
                 environ: Mapping[str, str]) -> tuple["Provider", Any, Callable[[str], str]]:
    """(the provider, its price, the redaction) as ``build_agent`` makes them."""
    from .agent import agent_parts

    _, prov, price, redact = agent_parts(
        config, environ, provider,
        "writing a reference from a description needs the LLM agent, which is not available")
    return prov, price, redact


def check_agent(config: ForgeConfig, environ: Mapping[str, str] = os.environ) -> None:
    """ConfigError naming why ``draft_reference`` cannot run (no provider, no key, no price)."""
    _agent_parts(config, None, environ)


def draft_reference(description: str, config: ForgeConfig, *, provider: "Provider | None" = None, workdir: Path,
                    environ: Mapping[str, str] = os.environ,
                    on_step: Callable[[dict[str, Any]], None] | None = None) -> Draft:
    """Hold the conversation in which the agent writes ``reference.py`` for ``description``.
    ``provider`` replaces the configured one (tests, replays); ConfigError when there is none."""
    from agent_tools import ReferenceEnv, reference_tools, run_tool

    from .agent.context import render
    from .agent.loop import Agent, Limits
    from .agent.transcript import NAME, Transcript
    from .funcards import class_name, slug
    from .search.ledger import Ledger

    description = " ".join(description.split())
    if not description:
        raise ForgeError("describe the operation: forge new \"fused LayerNorm + GELU for (8192, 4096) bf16\"")
    prov, price, redact = _agent_parts(config, provider, environ)
    workdir = Path(workdir)
    files = workdir / WORK
    files.mkdir(parents=True, exist_ok=True)
    a = config.agent
    limits = Limits(tool_calls=a.max_tool_calls, tokens=a.max_tokens, wall_s=a.max_wall_s, cost_usd=a.max_cost_usd,
                    output_tokens=a.max_output_tokens)
    card = f"new:{slug(description)}"
    ledger = Ledger(config.search.max_cost_usd, a.max_cost_per_card_usd)
    transcript = Transcript(workdir / NAME, redact)
    name = class_name(description)
    transcript.add("start", conversation=workdir.name, card=card, description=description, provider=prov.name,
                   model=prov.model, limits=limits.__dict__, price=price.model_dump())
    system = render("new_system.md", limits=(f"{limits.tool_calls} tool calls, {limits.tokens} tokens, "
                                             f"{limits.wall_s:.0f} s and ${limits.cost_usd:.2f} for this conversation"))
    existing = sorted(p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file())
    task = render("new_task.md", description=description,
                  files="\n".join(f"- {f}" for f in existing) or "(empty: write reference.py)")
    transcript.add("system", text=system)
    env = ReferenceEnv(workdir=files, confine=config.evaluator.confinement == "required")
    tools = {t.name: t for t in reference_tools()}

    def step(info: dict[str, Any]) -> None:
        if on_step is not None:
            on_step({**info, "summary": redact(info["summary"]), "conversation_cost_usd": agent.cost})

    agent = Agent(prov, price, [t.spec() for t in tools.values()], execute=lambda call: run_tool(tools, env, call),
                  submitted=lambda: env.submission is not None, limits=limits, ledger=ledger, card=card,
                  transcript=transcript, on_step=step, redact=redact)
    out = agent.run(system, task)
    sub = env.submission
    notes: list[str] = []
    if sub is not None:
        source, summary, report = sub.source, sub.notes, env.last_report
    else:
        source, summary, report = "", "", None
        try:
            source = safeio.read_text(files, REFERENCE, limit=env.max_read_bytes, strict=False)[1]
        except safeio.Missing:
            pass
        except safeio.Refused as exc:
            notes.append(f"{REFERENCE} was not read: {exc}")
    return Draft(description=description, name=name, source=source, summary=summary, report=report,
                 transcript=transcript.entries, transcript_path=workdir / NAME, workdir=workdir, cost_usd=out.cost_usd,
                 outcome=out, provider=prov.name, model=prov.model, submitted=sub is not None, notes=notes,
                 redact=redact)


# ---- approval --------------------------------------------------------------------------------------
def workload_source(draft: Draft) -> str:
    """The workload that wraps the reference: a forge workload (get_model/get_inputs) whose model
    is the leaf module ``draft.name``, loading ``reference.py`` from beside this file."""
    sha = hashlib.sha256(draft.source.encode()).hexdigest()
    return f'''"""forge new: {json.dumps(draft.description)[1:-1]}

The reference (reference.py, beside this file; sha256 {sha[:16]}) was written by the LLM agent
({draft.provider} {draft.model}) and approved before it became a card. This file wraps it in a leaf
module, {draft.name}, that the profiler makes one card (forge_card).
"""
import hashlib
import importlib.util
import sys
from pathlib import Path

import torch

_PATH = Path(__file__).with_name("reference.py")
_NAME = "forge_reference_" + hashlib.sha256(_PATH.read_bytes()).hexdigest()[:16]


def _load():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, _PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_NAME]
            raise
    return sys.modules[_NAME]


reference = _load()


class {draft.name}(torch.nn.Module):
    forge_card = True  # one card, even when the reference is a single op

    def forward(self, *inputs):
        return reference.reference(*inputs)


def get_model():
    return {draft.name}()


def get_inputs(device="cpu"):
    return list(reference.example_inputs(device=device))
'''


def default_workspace(description: str) -> Path:
    from .funcards import slug

    return Path("workspaces") / slug(description)


def accept(draft: Draft, workspace: Path | str, *, device: str | None = None, config_path: Path | None = None,
           approved_by: str = "", reuse: bool = True,
           progress: Callable[[str], None] = lambda msg: None) -> "CardWorkspace":
    """Make an approved draft a card: in a new workspace at ``workspace``, or added to the existing
    one there (``reuse``; else an existing workspace is an error). Runs the reference confined in a
    child process (``profile_confined``): call it only on a draft a person approved. Raises
    ForgeError, having written nothing, when the draft or its profile fails, and SecretInCommit
    (naming the variable, not the value) when the reference holds a secret."""
    from .funcards import profile_to_card

    if not draft.ok:
        raise ForgeError(f"this draft cannot become a card: {draft.why_not}")
    refuse_secrets([(REFERENCE, draft.source.encode()), ("the summary", draft.summary.encode())])
    who = approved_by or _user()
    stage = draft.workdir / "card"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    try:
        (stage / REFERENCE).write_text(draft.source)
        wl_path = stage / f"{_snake(draft.name)}.py"
        wl_path.write_text(workload_source(draft))
        workload = _unloaded_workload(wl_path)
        record = {"description": draft.description, "name": draft.name, "provider": draft.provider,
                  "model": draft.model, "summary": draft.summary, "cost_usd": round(draft.cost_usd, 6),
                  "queries": draft.outcome.queries, "tool_calls": draft.outcome.tool_calls, "approved_by": who,
                  "reference_sha256": hashlib.sha256(draft.source.encode()).hexdigest(),
                  "try_reference": draft.report.to_json() if draft.report is not None else None}
        try:
            transcript = safeio.read_beside(draft.transcript_path, limit=TRANSCRIPT_BYTES)
        except safeio.Missing:
            transcript = b""
        except safeio.Refused as exc:
            raise ForgeError(f"the conversation's transcript was not read: {exc}") from None

        def files(card: Any, folder: str) -> dict[str, bytes]:
            draft_dir = "draft/" if not folder else ""
            return {REFERENCE: draft.source.encode(), f"{draft_dir}transcript.jsonl": transcript,
                    f"{draft_dir}draft.json": (json.dumps({**record, "card": card.id}, indent=1) + "\n").encode()}

        return profile_to_card(workload, Path(workspace), draft.name, device=device, config_path=config_path,
                               files=files, reuse=reuse, progress=progress, profile=profile_confined)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


# ---- the accept step's profile, confined -------------------------------------------------------------
PROFILE_WALL_S = 1800.0
MAX_REPORT_BYTES = 64 << 20
STDERR_KEPT = 64 << 10


def _unloaded_workload(path: Path) -> Any:
    """The workload wrapping the reference, described without importing it (importing runs the
    reference): what the workspace records of it. The profile imports it, confined."""
    import types

    from .workload import Workload

    path = path.resolve()
    return Workload(path=path, name=path.stem, format="forge", module=types.ModuleType(path.stem),
                    source_sha=hashlib.sha256(path.read_bytes()).hexdigest(), default_dtype=None)


def profile_confined(workload: Any, device: str, dtype: Any, cfg: ForgeConfig, store: Any,
                     progress: Callable[[str], None] = lambda msg: None) -> Any:
    """``profile_workload`` in a confined child process (``_profile_child``): the approved
    reference is imported and run there, never in this process. The child reads only its folder,
    Python and its packages, forge_tui and forge's cache (read-only), writes only the tensor store,
    runs no program and opens no socket (Landlock where the kernel has it, the seccomp filter,
    no capabilities, a scrubbed environment); this process is made non-dumpable first, so its
    memory and /proc/PID/environ (the API key) stay out of reach. The child's answer is JSON,
    validated here (never a pickle). ForgeError, naming the cause, when it fails."""
    import signal
    import subprocess
    import sys
    import tempfile
    import threading

    import forge_tui

    from . import roofline
    from .evaluator import jail
    from .evaluator.confine import ConfinementUnavailable, build_filter

    del dtype  # a forge new card is profiled at the reference's own dtypes
    if cfg.evaluator.confinement == "required":
        try:
            build_filter(os.getpid(), writes=True)  # only to learn that the child can build it
        except ConfinementUnavailable as exc:
            raise ForgeError(f"the approved reference is profiled in a sandbox, which cannot be built here: {exc} "
                             '(or set [evaluator] confinement = "off")') from None
    roofline.ceilings(device)  # measured here, by forge's code: the child only reads them
    Path(store.root).mkdir(parents=True, exist_ok=True)
    package = Path(forge_tui.__file__).resolve().parent
    scratch = Path(tempfile.mkdtemp(prefix="forge-profile-"))  # the child's TMPDIR, removed after
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
           "HOME": str(workload.path.parent), "FORGE_CACHE_DIR": str(roofline.cache_dir()), "TMPDIR": str(scratch)}
    for name in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    spec = {"package": str(package), "workload": str(workload.path), "device": device,
            "write": [str(store.root), str(scratch)],
            "config": cfg.model_dump(mode="json"), "read": [*jail.PYTHON_SYSTEM_READ, str(roofline.cache_dir())],
            "confine": cfg.evaluator.confinement == "required"}
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from forge_tui.describe import _profile_child; "
            "_profile_child(sys.argv[2])")
    jail.not_dumpable()
    proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", code, str(package.parent), json.dumps(spec)],
                            cwd=workload.path.parent, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    def kill() -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    err = bytearray()

    def read_err() -> None:  # keeps the end only: the reference may print without end
        while proc.stderr is not None and (chunk := os.read(proc.stderr.fileno(), 1 << 16)):
            err.extend(chunk)
            del err[:-STDERR_KEPT]

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    timer = threading.Timer(PROFILE_WALL_S, kill)  # past it the whole process group is killed
    timer.start()
    answer = b""
    try:
        assert proc.stdout is not None
        while line := proc.stdout.readline(MAX_REPORT_BYTES):
            if line.startswith(b"P "):
                progress(redact_environment(line[2:].decode(errors="replace").rstrip()))
            elif line.startswith(b"R ") and line.endswith(b"\n"):
                answer = line[2:]
    finally:
        timer.cancel()
        kill()
        proc.wait()
        reader.join(timeout=5)
        shutil.rmtree(scratch, ignore_errors=True)
    tail = redact_environment(bytes(err).decode(errors="replace").strip()[-1500:])
    if not answer:
        why = "it ran past the wall-time limit" if proc.returncode == -signal.SIGKILL else \
            f"exit status {proc.returncode}"
        raise ForgeError(f"profiling the approved reference failed ({why})"
                         + (f": {tail.splitlines()[-1]}" if tail else ""))
    return _profile_result(answer)


def _profile_result(answer: bytes) -> Any:
    """The child's JSON made a ProfileResult again, every part validated."""
    from .cards import Card
    from .profiler.run import ProfileResult
    from .timing import Stats

    try:
        data = json.loads(answer)
        if "error" in data:
            raise ForgeError(f"profiling the approved reference failed: {redact_environment(str(data['error']))[:2000]}")
        fw = data["forward"]
        return ProfileResult(
            cards=[Card.model_validate(c) for c in data["cards"]],
            forward=Stats(median=float(fw["median"]), mean=float(fw["mean"]), min=float(fw["min"]),
                          max=float(fw["max"]), q1=float(fw["q1"]), q3=float(fw["q3"]), n=int(fw["n"])),
            device=str(data["device"]), device_name=str(data["device_name"]),
            dtype=None if data["dtype"] is None else str(data["dtype"]), ceilings=dict(data["ceilings"]),
            skipped={str(k): int(v) for k, v in dict(data["skipped"]).items()}, timing=dict(data["timing"]),
            calls_total=int(data["calls_total"]), warnings=[str(w) for w in data["warnings"]],
            forward_noisy=[str(w) for w in data["forward_noisy"]])
    except ForgeError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ForgeError(f"the profile of the approved reference could not be read: {type(exc).__name__}: "
                         f"{str(exc)[:300]}") from None


def _profile_child(raw: str) -> None:
    """The child of ``profile_confined``: confine this process, then profile the workload and
    answer one JSON line ("R ..."); progress lines ("P ...") before it."""
    import dataclasses
    import errno
    import sys
    import traceback

    spec = json.loads(raw)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the reference's prints go to stderr; stdout carries only progress and the answer

    def say(kind: str, text: str) -> None:
        out.write(f"{kind} {text}\n")
        out.flush()

    try:
        from .evaluator import confine, jail

        if spec["confine"]:
            flt = confine.build_filter(os.getpid(), writes=True)
            here = Path(spec["package"])
            own = [p for p in {*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
                   if p and p != str(here.parent)]
            rules = [(jail.READ_EXEC, p) for p in [*own, *spec["read"], str(here)]]
            rules += [(jail.LL_READ_DIR, str(here.parent)),  # the import system lists the folder forge_tui is in
                      (jail.READ, os.getcwd()), (jail.READ, f"/proc/{os.getpid()}"), (jail.READ, "/proc/loadavg"),
                      *[(jail.READ_WRITE, p) for p in spec["write"]]]
            if spec["device"] == "cuda":
                import glob

                rules += [(jail.LL_READ_FILE | jail.LL_WRITE_FILE | jail.LL_IOCTL_DEV, d)
                          for d in glob.glob("/dev/nvidia*")]
                rules += [(jail.READ, d) for d in ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices")]
            try:
                jail.landlock(rules)
            except OSError as exc:
                if exc.errno != errno.ENOSYS:
                    raise
            jail.drop_capabilities()
        import torch  # noqa: F401 - loaded before the filter: it maps and probes what it needs

        from .config import ForgeConfig
        from .profiler.run import profile_workload
        from .tensorstore import TensorStore
        from .workload import load_workload

        if spec["confine"]:
            flt.load()
        cfg = ForgeConfig.model_validate(spec["config"])
        res = profile_workload(load_workload(spec["workload"]), spec["device"], None, cfg,
                               TensorStore(Path(spec["write"][0])), lambda msg: say("P", msg),
                               coverage=False)  # the parent works it out (funcards.profile_to_card)
        say("R", json.dumps({"cards": [c.model_dump(mode="json") for c in res.cards],
                             "forward": dataclasses.asdict(res.forward), "device": res.device,
                             "device_name": res.device_name, "dtype": res.dtype, "ceilings": res.ceilings,
                             "skipped": res.skipped, "timing": res.timing, "calls_total": res.calls_total,
                             "warnings": res.warnings, "forward_noisy": res.forward_noisy}, default=str))
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which raises ForgeError
        traceback.print_exc()
        say("R", json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    out.close()
    os._exit(0)


def _snake(name: str) -> str:
    from .funcards import snake

    return snake(name)


def _user() -> str:
    import getpass

    try:
        return f"user {getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no login name (containers)
        return "user (unknown name)"
