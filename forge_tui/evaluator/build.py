"""Building candidates into shared libraries: nvcc (cuda) or g++ (cpu), cached by content hash,
several at a time on the CPU cores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..kernel_abi import HEADER, HEADER_DIR, SOURCE_NAMES, default_cuda_arch
from .diagnostics import Diagnostic, parse, resources


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

    def to_json(self) -> dict:
        return {"ok": self.ok, "backend": self.backend, "key": self.key,
                "library": str(self.library) if self.library else None, "seconds": self.seconds,
                "cached": self.cached, "command": self.command, "log": self.log, "reason": self.reason,
                "diagnostics": [d.to_json() for d in self.diagnostics], "resources": self.resources}


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


class Builder:
    """Compiles sources for one backend; results are cached under ``cache_dir/builds/<key>/``."""

    def __init__(self, backend: str, cache_dir: Path, *, arch: str | None = None, timeout_s: float = 120.0,
                 parallel: int = 0) -> None:
        if backend not in SOURCE_NAMES:
            raise ValueError(f"unknown backend {backend!r}")
        self.backend = backend
        self.cache_dir = Path(cache_dir).absolute() / "builds"
        self.arch = arch or (default_cuda_arch() if backend == "cuda" else "native")
        self.timeout_s = timeout_s
        self.parallel = parallel or os.cpu_count() or 1
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

    def build(self, source: str) -> BuildResult:
        key = self.key(source)
        folder = self.cache_dir / key
        lib = folder / "candidate.so"
        meta = folder / "build.json"
        with self._lock(key):
            if lib.exists() and meta.exists():
                info = json.loads(meta.read_text())
                return BuildResult(True, self.backend, key, lib, 0.0, True, info["command"], info["log"],
                                   parse(info["log"]), info.get("resources", {}))
            if not self.available():
                return BuildResult(False, self.backend, key, None, 0.0, False, [self.compiler], "",
                                   reason=f"{self.compiler} not found on PATH")
            folder.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=folder, prefix="build-"))
            try:
                src = tmp / SOURCE_NAMES[self.backend]
                src.write_text(source)
                out = tmp / "candidate.so"
                cmd = [self.compiler, *self.flags(), "-o", str(out), str(src)]
                t0 = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, cwd=tmp)
                except subprocess.TimeoutExpired as exc:
                    log = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")) + \
                          ((exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
                    return BuildResult(False, self.backend, key, None, time.perf_counter() - t0, False, cmd, log,
                                       parse(log), reason=f"compile timed out after {self.timeout_s:.0f} s")
                seconds = time.perf_counter() - t0
                log = (proc.stdout + proc.stderr).replace(str(tmp) + "/", "")
                diags = parse(log)
                res = resources(log) if self.backend == "cuda" else {}
                if proc.returncode != 0 or not out.exists():
                    errors = [d for d in diags if d.severity == "error"]
                    reason = str(errors[0]) if errors else f"compiler exited with status {proc.returncode}"
                    return BuildResult(False, self.backend, key, None, seconds, False, cmd, log, diags, res, reason)
                os.replace(out, lib)
                shutil.copyfile(src, folder / src.name)
                meta.write_text(json.dumps({"command": cmd, "log": log, "resources": res, "seconds": seconds}))
                return BuildResult(True, self.backend, key, lib, seconds, False, cmd, log, diags, res)
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
