"""Building candidates into shared libraries: nvcc (cuda) or g++ (cpu), cached by content hash,
several at a time on the CPU cores.

The compiler reads what the candidate names, so it is confined like the candidate itself. Before a
source is compiled, its includes are checked (``includes.py``: only the ABI header and the
toolchain's headers, no absolute path, no ``..``, no ``.incbin``), then the preprocessor lists the
files the compile would read (``-M``) and any outside the build folder, the ABI header and the
toolchain's include folders refuses the source with one line naming it. Both the preprocessor pass
and the compile run through ``jail.py``: a scrubbed environment (no API key or token: PATH, the
locale, the CUDA variables; HOME and TMPDIR the build folder), Landlock where the kernel has it
(read and execute the toolchain's folders, read the ABI header, read and write the build folder,
nothing else; no TCP), a seccomp filter (no socket at all, nothing of other processes or the
machine), no capabilities. Threads, fork and exec stay allowed: nvcc runs cicc, ptxas and gcc.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..kernel_abi import HEADER, HEADER_DIR, SOURCE_NAMES, default_cuda_arch
from . import includes
from .diagnostics import Diagnostic, parse, resources

SYSTEM_ROOTS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/include",
                "/usr/local/include", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache",
                "/etc/ld.so.conf", "/etc/ld.so.conf.d")
"""What every compile may read and execute: the system's programs, libraries and headers, and the
dynamic loader's cache (not /etc, /home, /root, /proc, /tmp or the workspace)."""
PASSED_ENV = ("LANG", "LC_ALL", "LC_MESSAGES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")
"""The variables of forge's environment a compile keeps (besides PATH); everything else, API keys
and tokens included, is left out."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")


@dataclass(frozen=True)
class Toolchain:
    """Where a compiler and its headers live, asked of the compiler once a process."""

    compiler: str
    """Its path on PATH."""
    include_dirs: tuple[str, ...]
    """The folders its ``#include <...>`` searches (the host compiler's too, for nvcc)."""
    roots: tuple[str, ...]
    """Everything a compile may read and execute (``SYSTEM_ROOTS``, the compiler's own folders)."""


_TOOLCHAINS: dict[tuple[str, str, str], Toolchain | None] = {}
_TOOLCHAIN_LOCK = threading.Lock()


def _run_quiet(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout + out.stderr


def _gcc_dirs(cxx: str) -> tuple[list[str], list[str]]:
    """(its include folders, its own folders: install, programs, libraries) as g++ reports them."""
    text = _run_quiet([cxx, "-x", "c++", "-std=c++17", "-E", "-v", os.devnull])
    dirs: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("#include <...> search starts here") or line.startswith('#include "..." search starts'):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.startswith(" "):
            dirs.append(os.path.normpath(line.strip().split(" (")[0]))
    own: list[str] = []
    for line in _run_quiet([cxx, "-print-search-dirs"]).splitlines():
        key, _, value = line.partition(": ")
        if key in ("install", "programs", "libraries"):
            own += [os.path.normpath(p) for p in value.lstrip("=").split(":") if p]
    return dirs, [d for d in own if os.path.isdir(d)]


def _nvcc_dirs(nvcc: str) -> tuple[list[str], list[str]]:
    """(CUDA's include folders, the toolkit's root) from ``nvcc --dryrun``."""
    text = _run_quiet([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    dirs: list[str] = []
    own: list[str] = []
    for line in text.splitlines():
        line = line.removeprefix("#$ ").strip()
        if line.startswith("TOP="):
            own.append(os.path.normpath(line[4:]))
        elif line.startswith(("INCLUDES=", "SYSTEM_INCLUDES=")):
            for tok in re.findall(r'"([^"]*)"', line):
                if tok.startswith("-I"):
                    tok = tok[2:]
                if tok.startswith("/"):
                    dirs.append(os.path.normpath(tok))
    return dirs, own


def toolchain(backend: str, compiler: str) -> Toolchain | None:
    """The toolchain of ``compiler`` (None when it is not on PATH), asked once a process."""
    key = (backend, compiler, os.environ.get("PATH", ""))
    with _TOOLCHAIN_LOCK:
        if key not in _TOOLCHAINS:
            exe = shutil.which(compiler)
            if exe is None:
                _TOOLCHAINS[key] = None
            else:
                if backend == "cuda":
                    dirs, own = _nvcc_dirs(exe)
                    host = shutil.which("g++") or shutil.which("gcc")
                    if host:
                        hdirs, hown = _gcc_dirs(host)
                        dirs, own = dirs + hdirs, own + hown
                else:
                    dirs, own = _gcc_dirs(exe)
                roots = [*SYSTEM_ROOTS, *dirs, *own, exe, os.path.realpath(exe)]
                _TOOLCHAINS[key] = Toolchain(exe, tuple(dict.fromkeys(dirs)), tuple(dict.fromkeys(roots)))
        return _TOOLCHAINS[key]


def _under_any(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for root in roots
               for r in (os.path.normpath(root), os.path.realpath(root)))


def compile_env(folder: Path, tc: Toolchain) -> dict[str, str]:
    """A compile's whole environment: PATH (its folders the toolchain may run from), the locale,
    the CUDA variables, HOME and TMPDIR the build folder; nothing secret."""
    path = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d and _under_any(d, tc.roots)]
    env = {"PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(tc.compiler), *path])),
           "HOME": str(folder), "TMPDIR": str(folder)}
    env.update({k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)})
    return env


@dataclass
class BuildResult:
    ok: bool
    backend: str
    key: str
    library: Path | None
    seconds: float
    cached: bool
    command: list[str]
    log: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    resources: dict = field(default_factory=dict)
    reason: str = ""
    confined: str = ""
    """How the compile was confined ("" for a cached build or one refused before compiling)."""

    def to_json(self) -> dict:
        return {"ok": self.ok, "backend": self.backend, "key": self.key,
                "library": str(self.library) if self.library else None, "seconds": self.seconds,
                "cached": self.cached, "command": self.command, "log": self.log, "reason": self.reason,
                "diagnostics": [d.to_json() for d in self.diagnostics], "resources": self.resources,
                "confined": self.confined}


_VERSION_CACHE: dict[str, str] = {}
_VERSION_LOCK = threading.Lock()


def compiler_version(exe: str) -> str:
    with _VERSION_LOCK:
        if exe not in _VERSION_CACHE:
            try:
                out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
                _VERSION_CACHE[exe] = out.stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                _VERSION_CACHE[exe] = "missing"
        return _VERSION_CACHE[exe]


JAIL = Path(__file__).with_name("jail.py")


class Builder:
    """Compiles sources for one backend; results are cached under ``cache_dir/builds/<key>/``.
    ``confine`` False runs the compiler as any program (full environment, no Landlock, no
    seccomp), for measuring what confinement costs; the include checks hold either way."""

    def __init__(self, backend: str, cache_dir: Path, *, arch: str | None = None, timeout_s: float = 120.0,
                 parallel: int = 0, confine: bool = True, landlock: bool = True) -> None:
        if backend not in SOURCE_NAMES:
            raise ValueError(f"unknown backend {backend!r}")
        self.backend = backend
        self.cache_dir = Path(cache_dir).absolute() / "builds"
        self.arch = arch or (default_cuda_arch() if backend == "cuda" else "native")
        self.timeout_s = timeout_s
        self.parallel = parallel or os.cpu_count() or 1
        self.confine = confine
        self.landlock = landlock
        self._pool: ThreadPoolExecutor | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @property
    def compiler(self) -> str:
        return os.environ.get("FORGE_NVCC", "nvcc") if self.backend == "cuda" else os.environ.get("FORGE_CXX", "g++")

    def available(self) -> bool:
        return shutil.which(self.compiler) is not None

    def flags(self) -> list[str]:
        if self.backend == "cuda":
            return ["-O3", "-std=c++17", f"-arch={self.arch}", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                    "-lineinfo", f"-I{HEADER_DIR}"]
        # -fno-trapping-math: nothing reads floating-point exception flags, so comparisons in a loop
        # may become selects and the loop vectorise (GCC keeps them as branches otherwise); the
        # arithmetic is unchanged (no reassociation, no fast-math)
        return ["-O3", "-std=c++17", "-march=native", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC", "-Wall",
                f"-I{HEADER_DIR}"]

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (self.backend, self.arch, json.dumps(self.flags()[:-1]), compiler_version(self.compiler),
                     HEADER.read_text(), source):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:24]

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def refusal(self, source: str) -> str:
        """Why the source's includes are refused before anything is compiled ("" when they are not)."""
        tc = toolchain(self.backend, self.compiler)
        problems = includes.source_problems(source, HEADER.name, tc.include_dirs if tc is not None else None)
        if not problems:
            return ""
        line, why = problems[0]
        return f"line {line}: {why}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")

    def _jail(self, folder: Path, tc: Toolchain) -> tuple[list[str], str, bool]:
        """(the command prefix that confines a compile in ``folder``, what it applies, whether
        Landlock is among it)."""
        from . import confine, jail

        env = compile_env(folder, tc)
        spec: dict = {"read_exec": [*tc.roots, str(HEADER)], "read_write": [str(folder)], "devices": list(DEVICES),
                      "env": env, "landlock": self.landlock, "cwd": str(folder)}
        notes = []
        version = jail.abi() if self.landlock else 0
        notes.append(f"landlock ABI {version}" if version else
                     "no landlock" + ("" if self.landlock else " (off)") + ": the include checks only")
        try:
            spec["bpf"] = confine.compiler_filter().hex()
            notes.append("seccomp (no network)")
        except confine.ConfinementUnavailable as exc:
            notes.append(f"no seccomp ({exc})")
        notes.append("scrubbed environment")
        return [sys.executable, "-I", "-S", "-B", str(JAIL), json.dumps(spec), "--"], ", ".join(notes), version > 0

    def _outside(self, deps: str, tmp: Path, tc: Toolchain, cmd: list[str]) -> BuildResult | None:
        """The refusal of a dependency list (``-M``'s make rule) naming a file outside the build
        folder, the ABI header and the toolchain's include folders; None when there is none."""
        bad = includes.outside(includes.parse_dependencies(deps), str(tmp), [str(tmp), str(HEADER), *tc.include_dirs])
        if not bad:
            return None
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return BuildResult(False, self.backend, tmp.parent.name, None, 0.0, False, cmd, "",
                           reason=f"the compile would read {bad[0]}{more}, outside the build folder, the ABI header "
                                  "and the toolchain's include folders: refused")

    def _dependencies(self, prefix: list[str], src: Path, tmp: Path, tc: Toolchain) -> BuildResult | None:
        """The preprocessor's list of what the compile would read, checked before the compile (None:
        every file lies under the allowed roots); the refusal, or the preprocessor's own failure,
        as a result. For a machine without Landlock, where nothing else keeps the compile from
        reading a file outside."""
        cmd = [self.compiler, *self.flags(), "-M", src.name]
        key = tmp.parent.name
        try:
            proc = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=self.timeout_s, cwd=tmp,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return BuildResult(False, self.backend, key, None, 0.0, False, cmd, "",
                               reason=f"the preprocessor pass timed out after {self.timeout_s:.0f} s")
        if proc.returncode != 0:
            # only what it says about the candidate's own lines: a header outside could be quoted
            mine = [d for d in parse(proc.stdout + proc.stderr.replace(str(tmp) + "/", "")) if d.file == src.name]
            errors = [d for d in mine if d.severity == "error"]
            reason = str(errors[0]) if errors else f"the preprocessor failed (status {proc.returncode})"
            return BuildResult(False, self.backend, key, None, 0.0, False, cmd, "\n".join(str(d) for d in mine),
                               mine, reason=reason)
        return self._outside(proc.stdout, tmp, tc, cmd)

    def build(self, source: str) -> BuildResult:
        key = self.key(source)
        folder = self.cache_dir / key
        lib = folder / "candidate.so"
        meta = folder / "build.json"
        refused = self.refusal(source)
        if refused:
            return BuildResult(False, self.backend, key, None, 0.0, False, [self.compiler], "", reason=refused)
        with self._lock(key):
            if lib.exists() and meta.exists():
                info = json.loads(meta.read_text())
                return BuildResult(True, self.backend, key, lib, 0.0, True, info["command"], info["log"],
                                   parse(info["log"]), info.get("resources", {}))
            tc = toolchain(self.backend, self.compiler)
            if tc is None:
                return BuildResult(False, self.backend, key, None, 0.0, False, [self.compiler], "",
                                   reason=f"{self.compiler} not found on PATH")
            folder.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=folder, prefix="build-"))
            try:
                src = tmp / SOURCE_NAMES[self.backend]
                src.write_text(source)
                out = tmp / "candidate.so"
                deps = tmp / "candidate.d"
                t0 = time.perf_counter()
                prefix: list[str] = []
                confined, landlocked = "not confined", False
                if self.confine:
                    prefix, confined, landlocked = self._jail(tmp, tc)
                # Under Landlock the compile cannot read a file outside, so its own dependency list
                # (-MD) is checked after it, before anything it printed is shown; without Landlock
                # a preprocessor pass lists them first, and nothing is compiled if one is outside.
                cmd = [self.compiler, *self.flags(), *(["-MD", "-MF", str(deps)] if landlocked else []),
                       "-o", str(out), str(src)]
                if self.confine and not landlocked:
                    refusal = self._dependencies(prefix, src, tmp, tc)
                    if refusal is not None:
                        refusal.key, refusal.seconds, refusal.confined = key, time.perf_counter() - t0, confined
                        return refusal
                try:
                    proc = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=self.timeout_s,
                                          cwd=tmp, stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired as exc:
                    log = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")) + \
                          ((exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
                    return BuildResult(False, self.backend, key, None, time.perf_counter() - t0, False, cmd, log,
                                       parse(log), reason=f"compile timed out after {self.timeout_s:.0f} s",
                                       confined=confined)
                seconds = time.perf_counter() - t0
                if landlocked and deps.is_file():
                    refusal = self._outside(deps.read_text(errors="replace"), tmp, tc, cmd)
                    if refusal is not None:
                        refusal.key, refusal.seconds, refusal.confined = key, seconds, confined
                        return refusal
                log = (proc.stdout + proc.stderr).replace(str(tmp) + "/", "")
                diags = parse(log)
                res = resources(log) if self.backend == "cuda" else {}
                if proc.returncode != 0 or not out.exists():
                    errors = [d for d in diags if d.severity == "error"]
                    reason = str(errors[0]) if errors else f"compiler exited with status {proc.returncode}"
                    return BuildResult(False, self.backend, key, None, seconds, False, cmd, log, diags, res, reason,
                                       confined)
                os.replace(out, lib)
                shutil.copyfile(src, folder / src.name)
                meta.write_text(json.dumps({"command": cmd, "log": log, "resources": res, "seconds": seconds}))
                return BuildResult(True, self.backend, key, lib, seconds, False, cmd, log, diags, res, confined=confined)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def build_many(self, sources: list[str]) -> list[BuildResult]:
        """Build several sources in parallel (one compiler process per core)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="forge-build")
        return list(self._pool.map(self.build, sources))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
