"""The judge's side of a candidate's runner process (``runner.c``): one fresh, confined process per
candidate, sharing only the candidate's inputs, outputs and workspace with the judge.

The judge allocates those buffers (a sealed memfd on the CPU, a CUDA allocation shared by IPC
handle on the GPU), writes inputs and poison into them, asks the runner to call the candidate,
and reads the outputs back to judge them itself. It times every call with its own clock, from
the request to the reply; the runner replies only once the call has returned and, on CUDA, the
whole context (every stream) is idle. The round trip of an empty request, measured before the
candidate's library is loaded (while the runner is still clean), is the overhead subtracted
from every sample.

Between its calls the runner can be frozen (SIGSTOP): the judge times the eager and compiled
baselines only while no candidate code can run.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import mmap
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..kernel_abi import DTYPE_CODES, HEADER, HEADER_DIR, MAX_DIMS, MAX_WORKSPACE_BYTES, ForgeTensor
from ..tensorstore import storage_extent
from . import confine

RUNNER_SOURCE = Path(__file__).resolve().parent / "runner.c"
ALIGN = 256
MAX_SETS = 64
_BUILD_LOCK = threading.Lock()


def process_cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (what ``clock_getcpuclockid`` returns): every thread's,
    those that exited included, as the kernel counts it, up to date when read."""
    return ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


class CandidateProcessError(Exception):
    """The candidate's process failed: ``kind`` is crash, timeout, load, confinement or device_error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def runner_executable(cache_root: Path) -> Path:
    """The runner, compiled once per source version and cached (a C compiler is required)."""
    cc = os.environ.get("FORGE_CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    h = hashlib.sha256(RUNNER_SOURCE.read_bytes() + HEADER.read_bytes() + cc.encode()).hexdigest()[:16]
    folder = Path(cache_root) / "runner" / h
    exe = folder / "forge-runner"
    with _BUILD_LOCK:
        if exe.exists():
            return exe
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix="build-"))
        try:
            out = tmp / "forge-runner"
            proc = subprocess.run([cc, "-O2", "-o", str(out), str(RUNNER_SOURCE), f"-I{HEADER_DIR}", "-ldl"],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"building the candidate runner failed: {proc.stderr.strip()[:2000]}")
            os.replace(out, exe)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return exe


_DRIVER = None


def _driver():
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = ctypes.CDLL("libcuda.so.1")
    return _DRIVER


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CandidateProcessError("harness", f"{what} failed with CUDA driver error {code}")


class _DeviceArray:
    """A raw device allocation offered to torch.as_tensor (CUDA array interface, uint8)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


@dataclass
class Slot:
    offset: int
    nbytes: int
    shape: tuple
    stride: tuple
    dtype: str


def _layout(specs: list, start: int = 0) -> tuple[list[Slot], int]:
    import torch

    slots, off = [], start
    for s in specs:
        item = torch.empty((), dtype=getattr(torch, s.dtype)).element_size()
        n = storage_extent(s.shape, s.stride) * item
        slots.append(Slot(off, n, tuple(s.shape), tuple(s.stride), s.dtype))
        off += -(-max(n, 1) // ALIGN) * ALIGN
    return slots, off


def _descriptor(slot: Slot) -> ForgeTensor:
    d = ForgeTensor()
    d.data = slot.offset
    d.dtype = DTYPE_CODES[slot.dtype]
    if len(slot.shape) > MAX_DIMS:
        raise ValueError(f"tensor of rank {len(slot.shape)} exceeds the ABI's {MAX_DIMS} dimensions")
    d.ndim = len(slot.shape)
    for k, (n, st) in enumerate(zip(slot.shape, slot.stride)):
        d.shape[k] = n
        d.stride[k] = st
    return d


def _signal_name(code: int) -> str:
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    desc = {signal.SIGSEGV: "segmentation fault", signal.SIGABRT: "abort", signal.SIGBUS: "bus error",
            signal.SIGFPE: "floating-point exception", signal.SIGILL: "illegal instruction",
            signal.SIGKILL: "killed", signal.SIGSYS: "forbidden system call"}.get(sig, sig.name)
    return f"{desc} ({sig.name})"


class Accused:
    """One candidate library in its own runner. Use as a context manager; never reused."""

    def __init__(self, runner: Path, library: str, inputs: list, outputs: list, scalars: list, device: str, *,
                 threads: int, call_limit_s: float, confinement: str = "required", landlock: bool = True,
                 sets: int = 1, spin_us: int | None = None) -> None:
        self.runner = Path(runner)
        self.library = str(library)
        self.device = device
        self.threads = threads
        self.call_limit_s = call_limit_s
        self.confinement = confinement
        self.landlock = landlock
        if not 1 <= sets <= MAX_SETS:
            raise ValueError(f"sets must be between 1 and {MAX_SETS}")
        self.sets = sets
        # Both sides poll the pipe for a while before sleeping on it (a woken process on a virtual
        # machine can take tens of µs to run); on the cpu backend the cores are the candidate's.
        self.spin_us = (2000 if device == "cuda" else 0) if spin_us is None else spin_us
        self.in_slots: list[list[Slot]] = []
        self.out_slots: list[list[Slot]] = []
        end = 0
        for _ in range(sets):
            ins, end = _layout(inputs, end)
            outs, end = _layout(outputs, end)
            self.in_slots.append(ins)
            self.out_slots.append(outs)
        self.arena_bytes = end
        self.scalars = scalars
        self.proc: subprocess.Popen[bytes] | None = None
        self.needs_workspace = False
        self.confined: dict = {}
        self.overhead_ns: list[int] = []
        self.overhead_cpu_ns: list[int] = []
        """The runner's CPU time for an empty request (``timed_call``); empty where the kernel does
        not say."""
        self.inputs: list = []
        """Set 0's inputs (the correctness checks use this set); ``batch_inputs[k]`` is set k's."""
        self.outputs: list = []
        self.batch_inputs: list[list] = []
        self.batch_outputs: list[list] = []
        self.workspaces: list = []
        self.workspace = None
        self._keep: list = []
        self._device_allocs: list[int] = []
        self._fds: list[int] = []
        self._log: Path | None = None
        self._w: int | None = None
        self._r: int | None = None
        self._stopped = False
        self.base_tasks: int | None = None
        """Threads of the runner before the candidate's library was loaded (its own, and on CUDA
        the driver's): what the candidate's own are counted against."""

    # ---- buffers ----------------------------------------------------------------------------
    def _views(self, base) -> None:
        import torch

        def view(slot: Slot):
            dt = getattr(torch, slot.dtype)
            flat = base[slot.offset: slot.offset + slot.nbytes].view(dt)
            return flat.as_strided(slot.shape, slot.stride, flat.storage_offset())

        self.batch_inputs = [[view(s) for s in slots] for slots in self.in_slots]
        self.batch_outputs = [[view(s) for s in slots] for slots in self.out_slots]
        self.inputs, self.outputs = self.batch_inputs[0], self.batch_outputs[0]

    def _cpu_region(self, nbytes: int, seal: bool):
        fd = os.memfd_create("forge-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._fds.append(fd)
        if nbytes:
            os.ftruncate(fd, nbytes)
        if seal:
            # The runner can neither shrink nor grow it: a shrunken arena would fault the judge.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return fd

    def _cpu_map(self, fd: int, nbytes: int):
        import torch

        mm = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._keep.append(mm)
        return torch.frombuffer(mm, dtype=torch.uint8)

    def _cuda_region(self, nbytes: int) -> tuple:
        """A device allocation of its own (cuMemAlloc, not the caching allocator: an IPC handle
        covers a whole allocation), seen here as a uint8 tensor and by the runner through IPC."""
        import torch

        cu = _driver()
        torch.zeros(1, device="cuda")  # torch creates the device's primary context
        ctx = ctypes.c_void_p()
        _check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:  # make it current on this thread (the one torch uses)
            dev = ctypes.c_int()
            _check(cu.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
            _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ptr = ctypes.c_uint64()
        size = max(nbytes, 1)
        _check(cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
        self._device_allocs.append(ptr.value)
        handle = (ctypes.c_char * 64)()
        _check(cu.cuIpcGetMemHandle(handle, ctypes.c_uint64(ptr.value)), "cuIpcGetMemHandle")
        base = torch.as_tensor(_DeviceArray(ptr.value, size), device="cuda")
        payload = bytes(handle) + struct.pack("<QQ", 0, nbytes)
        return base, payload

    # ---- process ----------------------------------------------------------------------------
    def start(self) -> "Accused":
        if self.device == "cuda":
            arena_fd = ws_fd = -1
        else:
            arena_fd = self._cpu_region(self.arena_bytes, seal=True)
            ws_fd = self._cpu_region(0, seal=False)
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        log_fd, log_path = tempfile.mkstemp(prefix="forge-runner-", suffix=".log")
        self._log = Path(log_path)
        env = {"OMP_NUM_THREADS": str(self.threads), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_DEVICE_ORDER"):
            if key in os.environ:
                env[key] = os.environ[key]
        fds = (to_r, from_w) + tuple(fd for fd in (arena_fd, ws_fd) if fd >= 0)
        self.proc = subprocess.Popen(
            [str(self.runner), str(to_r), str(from_w), self.device, str(arena_fd), str(ws_fd), str(self.spin_us)],
            pass_fds=fds, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=env,
            start_new_session=True, close_fds=True)
        os.close(log_fd)
        os.close(to_r)
        os.close(from_w)
        self._w, self._r = to_w, from_r
        if self.spin_us:
            os.set_blocking(from_r, False)
        status, text = self._reply(60.0, "start")
        if status != 0:
            raise CandidateProcessError("harness", f"the runner could not start: {text.decode(errors='replace')}")
        if self.device == "cuda":
            base, payload = self._cuda_region(self.arena_bytes)
        else:
            base, payload = self._cpu_map(arena_fd, self.arena_bytes), struct.pack("<Q", self.arena_bytes)
        self._views(base)
        self._request(b"A", payload, "setup")
        self._request(b"D", self._descriptor_table(), "setup")
        self.base_tasks = self.task_count()
        return self

    def _descriptor_table(self) -> bytes:
        n_in, n_out = len(self.in_slots[0]), len(self.out_slots[0])
        parts = [struct.pack("<iiii", self.sets, n_in, n_out, len(self.scalars))]
        for ins, outs in zip(self.in_slots, self.out_slots):
            for slot in ins + outs:
                parts.append(bytes(_descriptor(slot)))
        for sc in self.scalars:
            parts.append(bytes(sc.to_c()))
        return b"".join(parts)

    def measure_overhead(self, n: int, before=None) -> list[int]:
        """Round trips of an empty request (ns), taken while the runner holds no candidate code.
        ``before()`` runs ahead of each, as the judge's own work runs ahead of every timed call
        (on CUDA that makes the device switch from the judge's context to the runner's, as it
        will for the candidate)."""
        if self.needs_workspace or self.confined:
            raise RuntimeError("the overhead is measured before the candidate is loaded")
        self._sync()
        for _ in range(2):
            self._request(b"E", b"", "setup")
        out = []
        for _ in range(n):
            if before is not None:
                before()
            t0 = time.perf_counter_ns()
            self._request(b"E", b"", "setup")
            out.append(time.perf_counter_ns() - t0)
        self.overhead_ns = out
        # the same request on the runner's CPU clock (``timed_call``): what a busy machine's
        # samples subtract
        cpu = []
        for _ in range(n):
            self.freeze()
            self.thaw()
            ns, _ = self.timed_call(lambda: (0, self._exchange_ns(b"E", b"", "setup")))
            if ns is not None:
                cpu.append(ns)
        self.thaw()
        self.overhead_cpu_ns = cpu if len(cpu) == n else []
        return out

    def _exchange_ns(self, op: bytes, payload: bytes, phase: str) -> int:
        t0 = time.perf_counter_ns()
        self._request(op, payload, phase)
        return time.perf_counter_ns() - t0

    def timed_call(self, call: Callable[[], tuple[int, int]]) -> tuple[int | None, int]:
        """``call()`` -> (the CPU time the runner's process used meanwhile, ns, or None where the
        kernel does not say; its return code). On a busy machine a round trip waits for the runner
        to be scheduled, and the reply for the judge to be, while eager, in the judge, never waits
        so: CPU time counts neither. It is every thread's, those that exited included (work handed
        to a short-lived thread is counted), as the kernel counts it (the candidate cannot change
        it). The runner must be thawed, and is left frozen."""
        self.wait_asleep()
        c0 = self.process_cpu_ns()
        rc, _ = call()
        c1 = self.process_cpu_ns()
        self.freeze()
        if c0 is None or c1 is None:
            return None, rc
        return c1 - c0, rc

    def wait_asleep(self, limit_s: float = 1.0) -> None:
        """Waits until the runner's calling thread sleeps on its pipe (a thawed runner runs a
        moment before it does), so that a CPU clock read now counts nothing of that."""
        if self.proc is None:
            return
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.thread_states().get(self.proc.pid) in ("S", "D", None):
                return
            time.sleep(0)

    def process_cpu_ns(self) -> int | None:
        """The runner's process CPU time so far (ns; ``process_cpu_clock``), or None."""
        if self.proc is None:
            return None
        try:
            return time.clock_gettime_ns(process_cpu_clock(self.proc.pid))
        except OSError:
            return None

    def load(self) -> None:
        """Confine the runner, then load the library (its constructors run inside the cage)."""
        if self.confinement == "off":
            pol = confine.Policy(bpf=b"", landlock=b"", preload=confine.PRELOAD.get(self.device, []),
                                 description={"seccomp": "off", "landlock": "off"})
        else:
            try:
                pol = confine.policy(self.library, self.device, self._running.pid, landlock=self.landlock)
            except confine.ConfinementUnavailable as exc:
                raise CandidateProcessError("confinement", f"the candidate cannot be confined on this machine: "
                                            f"{exc}; set [evaluator] confinement = \"off\" to run unconfined") from None
        status, text = self._exchange(b"L", pol.load_request(self.library), 60.0, "load")
        msg = text.decode(errors="replace")
        if status == 2:
            raise CandidateProcessError("confinement", msg)
        if status != 0:
            raise CandidateProcessError("load", msg)
        kind, _, note = msg.partition(" ")
        self.needs_workspace = kind == "1"
        self.confined = {**pol.description, "landlock": note}

    def size_workspace(self) -> int:
        status, payload = self._exchange(b"S", b"", self.call_limit_s, "workspace")
        n = struct.unpack("<q", payload[:8])[0]
        if n < 0:
            raise CandidateProcessError("workspace", f"forge_workspace_bytes returned {n}: the candidate cannot "
                                        "serve these arguments")
        if n > MAX_WORKSPACE_BYTES:
            raise CandidateProcessError("workspace", f"forge_workspace_bytes asks for {n} bytes, over the "
                                        f"{MAX_WORKSPACE_BYTES} allowed")
        return n

    def set_threads(self, n: int) -> bool:
        """The OpenMP team size of the candidate's next calls (``omp_set_num_threads`` in the
        runner); False where the library has no OpenMP runtime (its calls use one thread)."""
        reply = self._request(b"T", struct.pack("<i", n), "setup")
        return bool(struct.unpack("<i", reply[:4])[0])

    def give_workspace(self, nbytes: int) -> None:
        """One workspace of ``nbytes`` per input set (a batch's calls each get a poisoned one)."""
        per = max(nbytes, 1)
        stride = -(-per // ALIGN) * ALIGN
        total = stride * self.sets
        if self.device == "cuda":
            base, region = self._cuda_region(total)
        else:
            fd = self._fds[-1]
            os.ftruncate(fd, total)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            base, region = self._cpu_map(fd, total), struct.pack("<Q", total)
        self.workspaces = [base[k * stride: k * stride + per] for k in range(self.sets)]
        self.workspace = base[:total]
        self._request(b"W", region + struct.pack("<QQ", nbytes, stride), "workspace")

    def call(self, first: int = 0, count: int = 1) -> tuple[int, int]:
        """Calls on sets first..first+count-1, back to back: (the first non-zero return code or 0,
        round-trip ns on the judge's clock, from the request to the reply sent once the device is
        idle)."""
        req = struct.pack("<ii", first, count)
        t0 = time.perf_counter_ns()
        status, payload = self._exchange(b"C", req, self.call_limit_s * count, "call")
        dt = time.perf_counter_ns() - t0
        if status == 4:
            text = payload.decode(errors="replace").split(" ", 2)
            raise CandidateProcessError("device_error", f"the candidate left the GPU in an error state: "
                                        f"{text[-1] if text else 'CUDA error'}")
        if status != 0:
            raise CandidateProcessError("harness", payload.decode(errors="replace"))
        rc = struct.unpack("<i", payload[:4])[0]
        return rc, dt

    # ---- freezing ---------------------------------------------------------------------------
    STOPPED_STATES = frozenset("TtZX")
    """A thread's state in /proc/PID/task/TID/stat that runs no code: stopped (by a signal or a
    tracer), or exited."""

    def freeze(self, verify_s: float = 1.0) -> None:
        """Stop every thread of the runner; returns once the kernel reports each one stopped (the
        group stop covers every thread of the process, those the candidate started included, and
        each is checked in /proc; one still running after ``verify_s`` is the harness's error)."""
        if self.proc is None or self._stopped:
            return
        try:
            os.kill(self.proc.pid, signal.SIGSTOP)
            os.waitpid(self.proc.pid, os.WUNTRACED)
            self._stopped = True
        except (ProcessLookupError, ChildProcessError):
            return
        deadline = time.monotonic() + verify_s
        while True:
            running = {tid: st for tid, st in self.thread_states().items() if st not in self.STOPPED_STATES}
            if not running:
                return
            if time.monotonic() > deadline:
                raise CandidateProcessError("harness", f"threads {sorted(running)} of the candidate's process did not "
                                            f"stop (states {sorted(set(running.values()))}) when it was frozen")
            time.sleep(0.001)

    def thread_states(self) -> dict[int, str]:
        """Each thread of the runner and its state letter (R running, S sleeping, T stopped...);
        empty where the kernel does not say."""
        out: dict[int, str] = {}
        if self.proc is None:
            return out
        try:
            tids = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/stat") as fh:
                    # "tid (comm) S ...": the command may hold spaces and parentheses
                    out[int(tid)] = fh.read().rpartition(")")[2].split()[0]
            except (OSError, IndexError, ValueError):
                continue  # the thread exited meanwhile
        return out

    def task_count(self) -> int | None:
        """The runner's threads now (its /proc task list), None where the kernel does not say."""
        if self.proc is None:
            return None
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/task"))
        except OSError:
            return None

    def cpu_ns(self) -> int | None:
        """CPU time the runner's threads have used so far (ns), or None where the kernel does not
        say (its process CPU clock; else the sum over its live threads' schedstat, which the kernel
        brings up to date when a thread leaves the CPU). Used to prove that a frozen runner did not
        run."""
        if self.proc is None:
            return None
        now = self.process_cpu_ns()
        if now is not None:
            return now
        total = 0
        try:
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as fh:
                    total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return total

    def thaw(self) -> None:
        if self.proc is None or not self._stopped:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self._stopped = False

    # ---- wire -------------------------------------------------------------------------------
    @property
    def _running(self) -> "subprocess.Popen[bytes]":
        if self.proc is None:
            raise RuntimeError("the runner is not started")
        return self.proc

    @property
    def _wfd(self) -> int:
        if self._w is None:
            raise RuntimeError("the runner's pipe is closed")
        return self._w

    @property
    def _rfd(self) -> int:
        if self._r is None:
            raise RuntimeError("the runner's pipe is closed")
        return self._r

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _request(self, op: bytes, payload: bytes, phase: str) -> bytes:
        status, data = self._exchange(op, payload, 60.0, phase)
        if status != 0:
            raise CandidateProcessError("harness", f"runner refused {op.decode()}: {data.decode(errors='replace')}")
        return data

    def _exchange(self, op: bytes, payload: bytes, limit_s: float, phase: str) -> tuple[int, bytes]:
        try:
            os.write(self._wfd, op + struct.pack("<I", len(payload)) + payload)
        except (BrokenPipeError, OSError):
            raise self._died(phase) from None
        return self._reply(limit_s, phase)

    def _read(self, n: int, deadline: float, phase: str) -> bytes:
        buf = b""
        if self.spin_us:
            spin_end = time.perf_counter() + self.spin_us * 1e-6
            while len(buf) < n and time.perf_counter() < spin_end:
                try:
                    chunk = os.read(self._rfd, n - len(buf))
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    raise self._died(phase)
                buf += chunk
                spin_end = time.perf_counter() + self.spin_us * 1e-6
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise CandidateProcessError("timeout", f"the candidate made no progress for {self._limit_of(phase):.0f} s "
                                            f"({phase}: endless loop or hang); its process was killed")
            ready, _, _ = select.select([self._rfd], [], [], min(left, 1.0))
            if not ready:
                if self._running.poll() is not None:
                    raise self._died(phase)
                continue
            try:
                chunk = os.read(self._rfd, n - len(buf))
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                raise self._died(phase)
            buf += chunk
        return buf

    def _limit_of(self, phase: str) -> float:
        return self.call_limit_s if phase in ("call", "workspace") else 60.0

    def _reply(self, limit_s: float, phase: str) -> tuple[int, bytes]:
        deadline = time.monotonic() + limit_s
        head = self._read(8, deadline, phase)
        status, n = struct.unpack("<iI", head)
        return status, (self._read(n, deadline, phase) if n else b"")

    def _died(self, phase: str) -> CandidateProcessError:
        code = None
        try:
            code = self._running.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        tail = self.log_tail()
        self.kill()
        how = _signal_name(code) if code is not None and code < 0 else f"exit status {code}"
        last = [ln for ln in tail.splitlines() if ln.strip()][-3:]
        return CandidateProcessError("crash", f"the candidate crashed its process in phase '{phase}': {how}"
                                     + (f"; last output: {' | '.join(last)}" if last else ""))

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self._log.read_bytes()[-n:].decode(errors="replace").strip() if self._log else ""
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the runner's whole process group (its session: anything it could have started)."""
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.thaw()
            try:
                os.write(self._wfd, b"Q\0\0\0\0")
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (getattr(self, "_w", None), getattr(self, "_r", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._w = self._r = None
        self.inputs, self.outputs, self.workspace, self.workspaces = [], [], None, []
        for k in self._keep:
            if isinstance(k, mmap.mmap):
                try:
                    k.close()
                except BufferError:
                    pass  # a view is still alive somewhere; the mapping goes with it
        self._keep.clear()
        if self._device_allocs:
            import gc

            import torch

            gc.collect()
            torch.cuda.synchronize()
            cu = _driver()
            for ptr in self._device_allocs:
                cu.cuMemFree_v2(ctypes.c_uint64(ptr))
            self._device_allocs.clear()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        if self._log is not None:
            self._log.unlink(missing_ok=True)

    def __enter__(self) -> "Accused":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
