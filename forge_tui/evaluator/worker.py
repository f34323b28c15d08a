"""The judge's process (the evaluator's worker), and the client that drives it.

The worker (``python -m forge_tui.evaluator.worker``) is the judge: it holds the references,
expected outputs, comparisons and clocks, and never loads candidate code. Each candidate runs in a
runner process of its own that the judge starts and confines (``accused.py``): a segfault, an
abort, an illegal memory access or an endless loop ends that runner, and the judge reports it as
the candidate's ``crash`` or ``timeout``. The judge lives on across candidates (its torch.compile
baselines stay warm); should the judge itself die or hang, the client reports it and starts a
fresh one. Messages travel on a dedicated pipe pair.

The worker reports the phase it enters (load, correctness, compile-baseline, timing); the client
gives each phase its own time limit, longer than the judge's own limit on a candidate's call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

PHASE_DEFAULT_LIMIT_S = 60.0


def _signal_name(code: int) -> str:
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    desc = {signal.SIGSEGV: "segmentation fault", signal.SIGABRT: "abort", signal.SIGBUS: "bus error",
            signal.SIGFPE: "floating-point exception", signal.SIGILL: "illegal instruction",
            signal.SIGKILL: "killed"}.get(sig, sig.name)
    return f"{desc} ({sig.name})"


class WorkerClient:
    """One worker process on one device. ``run`` is not thread-safe: the pool gives each worker
    one request at a time."""

    def __init__(self, device: str, *, limits: dict[str, float] | None = None, env: dict | None = None) -> None:
        self.device = device
        self.limits = {"load": 60.0, "correctness": PHASE_DEFAULT_LIMIT_S, "timing": PHASE_DEFAULT_LIMIT_S,
                       "compile-baseline": 600.0, **(limits or {})}
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._log_path: Path | None = None
        self.restarts = 0
        self._lock = threading.Lock()

    # ---- process management --------------------------------------------------------------------
    def start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        fd, log = tempfile.mkstemp(prefix="forge-worker-", suffix=".log")
        self._log_path = Path(log)
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forge_tui.evaluator.worker", str(to_child_r), str(from_child_w), self.device],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env,
            start_new_session=True,
        )
        os.close(fd)
        os.close(to_child_r)
        os.close(from_child_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(from_child_r, writable=False)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None and self._send is not None:
            try:
                self._send.send({"cmd": "exit"})
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                pass
        self._kill()

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
        for c in (self._send, self._recv):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._send = self._recv = None
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
        self.proc = None

    def _log_tail(self, n: int = 2000) -> str:
        try:
            data = self._log_path.read_bytes()[-n:] if self._log_path else b""
        except OSError:
            return ""
        return data.decode(errors="replace").strip()

    # ---- requests -------------------------------------------------------------------------------
    def run(self, request: dict) -> dict:
        """Send one evaluation; always returns a result dict, whatever the candidate does."""
        with self._lock:
            if not self.alive():
                self._kill()
                self.start()
            phase = "load"
            deadline = time.monotonic() + self.limits[phase]
            send, recv = self._send, self._recv
            assert send is not None and recv is not None  # start() opened them
            try:
                send.send({"cmd": "eval", **request})
            except (BrokenPipeError, OSError):
                return self._died(phase)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    limit = self.limits.get(phase, PHASE_DEFAULT_LIMIT_S)
                    self._kill()
                    self.restarts += 1
                    return {"status": "timeout", "failure": "timeout", "phase": phase,
                            "reason": f"no progress for {limit:.0f} s in phase '{phase}' (endless loop or hang); "
                                      "the worker was killed and restarted"}
                try:
                    ready = recv.poll(min(remaining, 1.0))
                except (OSError, EOFError):
                    return self._died(phase)
                if not ready:
                    if not self.alive():
                        return self._died(phase)
                    continue
                try:
                    msg = recv.recv()
                except (EOFError, OSError):
                    return self._died(phase)
                if "phase" in msg:
                    phase = msg["phase"]
                    deadline = time.monotonic() + self.limits.get(phase, PHASE_DEFAULT_LIMIT_S)
                    continue
                result = msg["result"]
                if msg.get("fatal"):  # the worker exits after a sticky device error
                    self._kill()
                    self.restarts += 1
                return result

    def _died(self, phase: str) -> dict:
        proc = self.proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
        tail = self._log_tail()
        self._kill()
        self.restarts += 1
        how = _signal_name(code) if code is not None and code < 0 else f"exit status {code}"
        last = [ln for ln in tail.splitlines() if ln.strip()][-3:]
        return {"status": "crash", "failure": "crash", "phase": phase,
                "reason": f"the candidate crashed the worker in phase '{phase}': {how}"
                          + (f"; last output: {' | '.join(last)}" if last else ""),
                "log_tail": tail}


# ---- the worker process itself --------------------------------------------------------------------
def _not_dumpable() -> None:
    """No process of this user may read this one's memory (/proc/PID/mem, ptrace): the expected
    outputs live here."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _serve(fd_in: int, fd_out: int, device: str) -> int:
    os.dup2(2, 1)  # anything printed goes to the log, never into the message pipe
    _not_dumpable()
    recv = Connection(fd_in, writable=False)
    send = Connection(fd_out, readable=False)
    import torch  # noqa: F401 - imported once, before the first request

    from .harness import FatalDeviceError
    from .judge import evaluate_in_worker

    state: dict = {}
    while True:
        try:
            msg = recv.recv()
        except EOFError:
            return 0
        cmd = msg.get("cmd")
        if cmd == "exit":
            return 0
        if cmd == "ping":
            send.send({"result": "pong"})
            continue
        if cmd == "eval":
            try:
                result = evaluate_in_worker(msg, lambda p: send.send({"phase": p}), state)
            except FatalDeviceError as exc:
                send.send({"result": {"status": "crash", "failure": "device_error",
                                      "reason": f"the candidate left the GPU in an error state: {exc}"},
                           "fatal": True})
                return 3
            send.send({"result": result})


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
