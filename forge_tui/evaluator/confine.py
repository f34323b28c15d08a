"""The cage a candidate runs in: a seccomp filter (built with libseccomp) and Landlock rules.

The judge builds the filter here, in Python, with libseccomp through ``pyseccomp``, exports it as
compiled BPF and sends it to the runner (``runner.c``), which installs it on itself right before it
loads the candidate's library; the agent's ``try_reference`` tool (``agent_tools/reference.py``)
loads the same rules into the Python process that runs a drafted reference (``build_filter``). The
filter allows by default and refuses, with EPERM, what a kernel
has no business doing and what would let it reach the judge or the machine:

* new processes and programs: fork, vfork, clone without CLONE_THREAD (threads stay allowed for
  OpenMP and the CUDA driver), clone3 (ENOSYS, so libc falls back to clone), execve, execveat;
* signals and scheduling aimed at any other process: kill/tgkill/rt_sigqueueinfo to another pid,
  tkill, pidfd_*, ptrace, process_vm_*, setpriority, sched_set*, prlimit64 on another pid;
* network: socket, socketpair, connect, bind, listen, accept;
* writing files: open/openat for writing or creating, creat, openat2, truncate, ftruncate,
  fallocate, rename/link/unlink/mkdir/chmod/chown families, xattrs, utimes;
* the rest of the machine: mount, namespaces, modules, bpf, perf_event_open, io_uring (which
  would bypass this filter), userfaultfd, keyrings, clocks, reboot.

The compiler gets a filter of its own (``compiler_filter``: no socket at all, nothing of other
processes or the machine; processes, exec and writes stay allowed), applied by ``jail.py``.

Landlock (where the kernel has it) narrows reading too: the runner can open the candidate's
library and, on CUDA, the driver's device files, and nothing else. Without Landlock, files stay
readable but not writable; the judge's memory is out of reach either way (the judge is not
dumpable and the runner drops its capabilities).
"""

from __future__ import annotations

import errno
import glob
import io
import os
import struct
from dataclasses import dataclass, field

CLONE_THREAD = 0x00010000
O_ACCMODE, O_WRONLY, O_RDWR, O_CREAT, O_TRUNC = 0o3, 0o1, 0o2, 0o100, 0o1000

FS_WRITES = (
    "creat", "openat2", "truncate", "ftruncate", "fallocate", "rename", "renameat", "renameat2", "link",
    "linkat", "symlink", "symlinkat", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat",
    "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "setxattr", "lsetxattr",
    "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "utime", "utimes", "utimensat", "futimesat",
)
"""The file-system changes among ``DENY``: a process that must write (the accept step of forge new,
which writes the captured tensors) keeps them, with Landlock holding its writes to one folder."""
DENY = (
    "fork", "vfork", "execve", "execveat", "tkill", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "kcmp", "setpriority", "sched_setaffinity",
    "sched_setscheduler", "sched_setparam", "sched_setattr", "ioprio_set", "migrate_pages", "move_pages",
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    *FS_WRITES,
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "swapon", "swapoff", "reboot",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "quotactl",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fanotify_init", "name_to_handle_at", "open_by_handle_at",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "personality", "iopl", "ioperm",
    "setsid", "setpgid", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "capset",
)

# Landlock access rights (linux/landlock.h)
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_IOCTL_DEV = 1 << 15


class ConfinementUnavailable(RuntimeError):
    """The machine cannot build the filter (no libseccomp, or not Linux)."""


@dataclass
class Policy:
    """What the runner installs before it loads a candidate."""

    bpf: bytes
    landlock: bytes
    preload: list[str] = field(default_factory=list)
    description: dict = field(default_factory=dict)

    def load_request(self, library: str) -> bytes:
        out = [struct.pack("<I", len(self.preload))]
        for name in self.preload:
            b = name.encode()
            out.append(struct.pack("<I", len(b)) + b)
        out.append(struct.pack("<I", len(self.landlock)) + self.landlock)
        out.append(struct.pack("<I", len(self.bpf)) + self.bpf)
        path = os.fsencode(library)
        out.append(struct.pack("<I", len(path)) + path)
        return b"".join(out)


def _seccomp():
    try:
        import pyseccomp  # raises RuntimeError at import when libseccomp.so is missing

        pyseccomp.system_arch()
    except Exception as exc:  # noqa: BLE001 - libseccomp.so missing or not Linux
        raise ConfinementUnavailable(f"libseccomp could not be loaded: {exc} "
                                     "(install the libseccomp2 package)") from None
    return pyseccomp


def build_filter(pid: int, *, writes: bool = False):
    """The filter (a pyseccomp ``SyscallFilter``, not yet loaded) for the process with this pid:
    the rules above (``writes``: without those refusing file writes). The runner gets it as BPF
    (``seccomp_filter``); a process confining itself (the agent's ``try_reference`` child) calls
    ``build_filter(os.getpid()).load()``."""
    sc = _seccomp()
    eperm = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENY:
        if writes and name in FS_WRITES:
            continue
        try:
            f.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            pass  # a syscall this architecture does not have (e.g. fork on arm64)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(eperm, name, sc.Arg(0, sc.NE, pid))
    f.add_rule(eperm, "prlimit64", sc.Arg(0, sc.NE, 0), sc.Arg(2, sc.NE, 0))
    for name, flags_arg in (("open", 1), ("openat", 2)):
        if writes:
            break
        try:
            f.add_rule(eperm, name, sc.Arg(flags_arg, sc.MASKED_EQ, O_ACCMODE, O_WRONLY))
            f.add_rule(eperm, name, sc.Arg(flags_arg, sc.MASKED_EQ, O_ACCMODE, O_RDWR))
            f.add_rule(eperm, name, sc.Arg(flags_arg, sc.MASKED_EQ, O_CREAT, O_CREAT))
            f.add_rule(eperm, name, sc.Arg(flags_arg, sc.MASKED_EQ, O_TRUNC, O_TRUNC))
        except (OSError, ValueError, RuntimeError):
            pass  # no legacy open() on this architecture
    return f


COMPILER_DENY = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "ptrace", "process_vm_readv",
    "process_vm_writev", "pidfd_getfd", "kcmp", "mount", "umount2", "pivot_root", "chroot", "setns", "unshare",
    "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "acct", "quotactl", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init", "name_to_handle_at",
    "open_by_handle_at", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "iopl", "ioperm",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "capset",
)
"""What the compiler (``jail.py`` around nvcc or g++) may not do: no network (no socket at all, so
no Unix socket to a local daemon either), no reaching other processes, nothing of the machine's.
Processes, threads, exec and file writes stay allowed: Landlock keeps the writes in the build folder."""

_COMPILER_BPF: bytes | None = None


def compiler_filter() -> bytes:
    """The compiler's filter (``COMPILER_DENY``, refused with EPERM) as compiled BPF, made once."""
    global _COMPILER_BPF
    if _COMPILER_BPF is None:
        sc = _seccomp()
        f = sc.SyscallFilter(sc.ALLOW)
        for name in COMPILER_DENY:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError, RuntimeError):
                pass  # a syscall this architecture does not have
        _COMPILER_BPF = _export(f)
    return _COMPILER_BPF


def _export(f) -> bytes:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as wf:
        f.export_bpf(wf)
    with os.fdopen(r, "rb") as rf:
        return rf.read()


def seccomp_filter(runner_pid: int) -> bytes:
    """The filter as compiled BPF (struct sock_filter array) for the runner with this pid."""
    f = build_filter(runner_pid)
    buf = io.BytesIO()
    r, w = os.pipe()
    try:
        with os.fdopen(w, "wb") as wf:
            f.export_bpf(wf)
        with os.fdopen(r, "rb") as rf:
            buf.write(rf.read())
    finally:
        pass
    return buf.getvalue()


def landlock_rules(library: str, device: str) -> bytes:
    """Landlock rules: read the candidate's library; on CUDA, use the driver's device files."""
    rules = [(LL_READ_FILE | LL_EXECUTE, library)]
    if device == "cuda":
        for path in sorted(set(glob.glob("/dev/nvidia*"))):
            rules.append((LL_READ_FILE | LL_WRITE_FILE | LL_IOCTL_DEV, path))
    out = [struct.pack("<I", len(rules))]
    for access, path in rules:
        b = os.fsencode(path)
        out.append(struct.pack("<QI", access, len(b)) + b)
    return b"".join(out)


PRELOAD = {"cpu": ["libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libgomp.so.1"],
           "cuda": ["libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libgomp.so.1", "librt.so.1",
                    "libpthread.so.0", "libdl.so.2"]}


def policy(library: str, device: str, runner_pid: int, *, landlock: bool = True) -> Policy:
    """The cage for one candidate. Raises ConfinementUnavailable where seccomp cannot be built."""
    return Policy(bpf=seccomp_filter(runner_pid),
                  landlock=landlock_rules(library, device) if landlock else b"",
                  preload=PRELOAD["cuda" if device == "cuda" else "cpu"],
                  description={"seccomp": "libseccomp (pyseccomp): default allow, "
                                          f"{len(DENY) + 8} rules refusing processes, exec, network, "
                                          "file writes and signals to other processes",
                               "landlock": "requested" if landlock else "off"})
