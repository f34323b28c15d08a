import json
import os
import sys
from pathlib import Path

import pytest

# inductor compiles in this process instead of warming a pool of compile workers (a torch import
# each): the tests' graphs are small and the 2-core CI machine has no core to spare for a pool
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
FAST_TOML = """
[timing]
warmup = 1
repeats = 3
threads = 1
max_spread = 10.0
max_slowdown = 100.0
"""


TIMED_WIN_ATTEMPTS = 3
"""Times a test that needs a kernel measured faster than eager runs its real search before it
gives up (``timed_win``)."""


def timed_win(search, attempts: int = TIMED_WIN_ATTEMPTS):
    """What ``search(attempt)`` made, the first time it holds a kernel measured faster than eager.

    A test that needs a promotion request (the approvals queue, ``forge approve``) needs a kernel
    that a real CPU evaluation timed as faster than eager, and a measurement on a shared machine
    can say otherwise: on this 2-core machine about one search in fifteen timed the fused RMSNorm
    as noisy (timing untrusted) or, once, at 0.58x eager, where it usually measures 4-6x. The test
    is about what follows, not about the speed, so the search runs again, in a fresh folder, until
    its kernel is a timed win. ``search(attempt)`` returns ``(what, won)``."""
    for attempt in range(attempts):
        what, won = search(attempt)
        if won:
            return what
    raise AssertionError(f"no kernel measured faster than eager in {attempts} searches (the last made {what!s:.200})")


def won_request(ws_root) -> bool:
    """Whether the workspace has a pending promotion request (a passed node faster than eager)."""
    from forge_tui.promotion import requests
    from forge_tui.workspace import Workspace

    return bool(requests(Workspace.open(ws_root)))


FIXED_CPU_CEILINGS = {
    # above what a 2-core CI machine reaches, so that no floor is too high for a correct candidate
    # however loaded the machine was: tests never depend on the machine's measured speed, and the
    # tests of the measurement itself call it directly (test_roofline_cpu)
    "bandwidth_curve": [[(16 << 10) << (2 * k), bw] for k, bw in
                        enumerate((100e9, 80e9, 60e9, 50e9, 40e9, 30e9, 25e9, 25e9))],
    "bandwidth_Bps": 25e9,
    "peak_flops": {"float32": 1e12, "float16": 2e11, "bfloat16": 5e11},
    "device_name": "CPU (the tests' fixed ceilings)",
    "measured_at": "fixed",
    "method": {"fixed": True},
}


def _write_fixed_cpu_ceilings(cache) -> None:
    """The CPU's ceilings, fixed (``FIXED_CPU_CEILINGS``), where ``roofline.ceilings`` reads them."""
    from forge_tui import roofline

    data = {"version": roofline.CACHE_VERSION, "devices": {roofline.device_key("cpu"): FIXED_CPU_CEILINGS}}
    (cache / "ceilings.json").write_text(json.dumps(data))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Device ceilings and other caches go to a per-session folder, never the user's home."""
    cache = tmp_path_factory.mktemp("forge-cache")
    old = os.environ.get("FORGE_CACHE_DIR")
    os.environ["FORGE_CACHE_DIR"] = str(cache)
    _write_fixed_cpu_ceilings(cache)
    yield cache
    if old is None:
        os.environ.pop("FORGE_CACHE_DIR", None)
    else:
        os.environ["FORGE_CACHE_DIR"] = old


@pytest.fixture
def fast_config(tmp_path, monkeypatch):
    """Run in an empty folder with a forge.toml that keeps timing short."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forge.toml").write_text(FAST_TOML)
    return tmp_path / "forge.toml"


@pytest.fixture(scope="session")
def fast_cfg():
    import tomllib

    from forge_tui.config import parse_config

    return parse_config(tomllib.loads(FAST_TOML))


@pytest.fixture(scope="session")
def decoder_workspace(tmp_path_factory):
    """A profiled tiny_decoder workspace shared by read-only tests."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("ws")
    cfg = root / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, result = profile_into_workspace("example:tiny_decoder", root / "decoder", device="cpu", config_path=cfg)
    return ws


def python_exe() -> str:
    return sys.executable


# ---- judges kept for the next test --------------------------------------------------------------
# An evaluator starts its judge (``python -m forge_tui.evaluator.worker``: a torch import, about
# 2.5 CPU-s) on its first candidate and ends it when it closes; most tests open an evaluator of
# their own, and the suite started about 90 judges. The judge serves any number of requests (the
# search sends it one candidate after another) and each request carries its card, store, timing
# and options, so a judge an evaluator closed is kept here and handed to the next evaluator of
# this test process that would start one with the same device, environment and working folder.
# A kept judge must answer a ping before it is handed on; one that does not is killed and a fresh
# one started. The modules in FRESH_JUDGE_MODULES test the judge itself (its process, its crashes,
# its confinement, its limits, its builds) and always get a judge and builds of their own, as
# outside the tests.
FRESH_JUDGE_MODULES = {"test_evaluator_cpu", "test_judge_cpu", "test_sandbox_leaks", "test_load", "test_search",
                       "test_cluster", "test_inputs_adversarial", "test_arbiter", "test_store_damage",
                       "test_evaluator_cuda"}
_KEPT_JUDGES: dict[tuple, list] = {}
_SHARE_JUDGES = {"on": True}


def _judge_key(client) -> tuple:
    env = {**os.environ, **(client.env or {}), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)  # pytest's own note of the running test
    return client.device, os.getcwd(), tuple(sorted(env.items()))


def _answers(proc, send, recv) -> bool:
    """Whether a kept judge is alive and idle: a ping answered by its pong, nothing else waiting."""
    if proc.poll() is not None:
        return False
    try:
        if recv.poll(0):  # a message left over from a request that did not finish
            return False
        send.send({"cmd": "ping"})
        return recv.poll(30) and recv.recv() == {"result": "pong"}
    except (OSError, EOFError):
        return False


def _end_judge(proc, send, recv, log) -> None:
    from forge_tui.evaluator.worker import WorkerClient

    client = WorkerClient("cpu")
    client.proc, client._send, client._recv, client._log_path = proc, send, recv, log
    client._kill()


@pytest.fixture(scope="session", autouse=True)
def _shared_judges():
    from forge_tui.evaluator.worker import WorkerClient

    start, stop, log_tail = WorkerClient.start, WorkerClient.stop, WorkerClient._log_tail

    def shared_start(self) -> None:
        key = _judge_key(self)
        kept = _KEPT_JUDGES.get(key, []) if _SHARE_JUDGES["on"] else []
        while kept:
            proc, send, recv, log = kept.pop()
            if _answers(proc, send, recv):
                self.proc, self._send, self._recv, self._log_path = proc, send, recv, log
                self._judge_key, self._log_from = key, log.stat().st_size
                return
            _end_judge(proc, send, recv, log)
        start(self)
        self._judge_key, self._log_from = key, 0

    def shared_stop(self) -> None:
        key = getattr(self, "_judge_key", None)
        if _SHARE_JUDGES["on"] and key is not None and self.alive() and self._send is not None:
            kept = _KEPT_JUDGES.setdefault(key, [])
            kept.append((self.proc, self._send, self._recv, self._log_path))
            while len(kept) > 2:
                _end_judge(*kept.pop(0))
            self.proc, self._send, self._recv, self._log_path = None, None, None, None
            return
        stop(self)

    def shared_log_tail(self, n: int = 2000) -> str:
        """What the judge wrote since this client took it (a kept judge's log holds earlier tests' too)."""
        start_at = getattr(self, "_log_from", 0)
        try:
            data = self._log_path.read_bytes()[start_at:][-n:] if self._log_path else b""
        except OSError:
            return log_tail(self, n)
        return data.decode(errors="replace").strip()

    WorkerClient.start, WorkerClient.stop, WorkerClient._log_tail = shared_start, shared_stop, shared_log_tail
    yield
    WorkerClient.start, WorkerClient.stop, WorkerClient._log_tail = start, stop, log_tail
    for kept in _KEPT_JUDGES.values():
        while kept:
            _end_judge(*kept.pop())


# ---- builds of the same source shared -----------------------------------------------------------
# Builds are cached by content hash (``Builder.key``: backend, arch, flags, compiler version, ABI
# header, source) under each workspace's own cache folder, and tests build the same sources in
# workspaces of their own (the chain tests' rotary kernel nine times): 85 of the suite's 277
# compiles built a key already built. A build a test process made is copied into the next cache
# folder that asks for its key, where ``Builder.build`` finds it as its own cached build. The
# modules in FRESH_JUDGE_MODULES build everything themselves.
_BUILT: dict[str, Path] = {}


def _copy_build(first: Path, folder: Path, source_name: str) -> bool:
    """The build in ``first`` copied into ``folder`` (its metadata last, each file whole or not at all)."""
    import shutil
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in (source_name, "candidate.so", "build.json"):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-")
            os.close(fd)
            shutil.copyfile(first / name, tmp)
            os.replace(tmp, folder / name)
        return True
    except OSError:
        return False


@pytest.fixture(scope="session", autouse=True)
def _shared_builds():
    from forge_tui.evaluator.build import Builder
    from forge_tui.kernel_abi import SOURCE_NAMES

    build = Builder.build

    def shared_build(self, source: str):
        key = self.key(source)
        folder = self.cache_dir / key
        first = _BUILT.get(key) if _SHARE_JUDGES["on"] else None
        if first is not None and first != folder and not (folder / "build.json").exists():
            if not _copy_build(first, folder, SOURCE_NAMES[self.backend]):
                _BUILT.pop(key, None)
        result = build(self, source)
        if _SHARE_JUDGES["on"] and result.ok and not result.cached:
            _BUILT.setdefault(key, folder)
        return result

    Builder.build = shared_build
    yield
    Builder.build = build


@pytest.fixture(scope="module", autouse=True)
def _fresh_judges_here(request, _shared_judges, _shared_builds):
    """A module of FRESH_JUDGE_MODULES gets judges and builds of its own, as outside the tests."""
    if request.module.__name__.rsplit(".", 1)[-1] not in FRESH_JUDGE_MODULES:
        yield
        return
    _SHARE_JUDGES["on"] = False
    yield
    _SHARE_JUDGES["on"] = True
