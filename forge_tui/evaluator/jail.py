"""Confining a process that forge starts on code it did not write: Landlock for files (and TCP where
the kernel has it), a seccomp filter against the network and the rest of the machine, no
capabilities, and a scrubbed environment.

Two users:

* the builder (``build.py``) runs the compiler, and its preprocessor pass, through this file as a
  script: ``python -I -S -B jail.py SPEC -- compiler args...``. The script (standard library only,
  so it starts in a few tens of milliseconds) applies ``SPEC`` (JSON: the folders to read and
  execute, the folders to read and write, the seccomp filter as BPF) to itself and then executes
  the compiler, which inherits all of it: nvcc's cicc, ptxas and gcc, gcc's cc1plus, as and ld are
  confined the same way. Threads, fork and exec stay allowed.
* the reference run (``agent_tools/reference.py`` and ``forge new``'s accept) loads this file by
  path and calls ``landlock`` and ``drop_capabilities`` on its own process before it imports the
  reference.

Landlock is the kernel's unprivileged sandbox (Linux 5.13+): a process restricts itself and every
process it starts to the paths named, whoever it runs as (root included). Where the kernel lacks
it, ``landlock`` says so and the callers keep their other defences (the builder's include and
dependency checks, the reference's seccomp filter); ``abi()`` is 0 there.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import struct
import sys

# linux/landlock.h
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_READ_FILE = 1 << 2
LL_READ_DIR = 1 << 3
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE_CHAR = 1 << 6
LL_MAKE_DIR = 1 << 7
LL_MAKE_REG = 1 << 8
LL_MAKE_SOCK = 1 << 9
LL_MAKE_FIFO = 1 << 10
LL_MAKE_BLOCK = 1 << 11
LL_MAKE_SYM = 1 << 12
LL_REFER = 1 << 13  # ABI 2
LL_TRUNCATE = 1 << 14  # ABI 3
LL_IOCTL_DEV = 1 << 15  # ABI 5
LL_NET_BIND_TCP = 1 << 0  # ABI 4
LL_NET_CONNECT_TCP = 1 << 1
LL_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
LL_SCOPE_SIGNAL = 1 << 1
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_NR = {"x86_64": (444, 445, 446, 317), "aarch64": (444, 445, 446, 277)}
"""landlock_create_ruleset, landlock_add_rule, landlock_restrict_self, seccomp."""
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_DUMPABLE = 38, 24, 4
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1

READ = LL_READ_FILE | LL_READ_DIR
READ_EXEC = READ | LL_EXECUTE
FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
"""The rights a rule on a file (not a folder) may carry."""
READ_WRITE = (READ | LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_DIR | LL_MAKE_REG | LL_TRUNCATE
              | LL_REFER)

PYTHON_SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache",
                      "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu", "/sys/devices/system/node",
                      "/dev/null", "/dev/zero", "/dev/urandom")
"""What a confined Python process running a reference may read besides its folder and Python's own
(the shared libraries torch loads, what torch asks of the CPU): not /etc, /home, /root, /tmp, or
another process's /proc."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _nr(i: int) -> int:
    machine = os.uname().machine
    if machine not in _NR:
        raise OSError(errno.ENOSYS, f"no syscall numbers for {machine}")
    return _NR[machine][i]


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    try:
        v = _libc.syscall(_nr(0), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0
    return max(int(v), 0)


def _handled(version: int) -> int:
    fs = ((1 << 13) - 1)
    if version >= 2:
        fs |= LL_REFER
    if version >= 3:
        fs |= LL_TRUNCATE
    if version >= 5:
        fs |= LL_IOCTL_DEV
    return fs


def landlock(rules: list[tuple[int, str]]) -> str:
    """Restrict this process (this thread and every process and thread it starts from now on) to
    ``rules``, (access rights, path) pairs: everything else on the file system is refused, and,
    where the ABI has them, TCP bind and connect, abstract Unix sockets and signals to processes
    outside the sandbox. A path that does not exist is skipped. Sets no_new_privs (Landlock needs
    it). Returns what was applied ("landlock ABI 7"); raises OSError where Landlock is missing."""
    version = abi()
    if version < 1:
        raise OSError(errno.ENOSYS, "Landlock is not available in this kernel")
    fs = _handled(version)
    attr = struct.pack("<Q", fs)
    if version >= 4:
        attr += struct.pack("<Q", LL_NET_BIND_TCP | LL_NET_CONNECT_TCP)
    if version >= 6:
        attr += struct.pack("<Q", LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL)
    buf = ctypes.create_string_buffer(attr, len(attr))
    rs = _libc.syscall(_nr(0), buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if rs < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        for access, path in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = access & fs
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= FILE_RIGHTS
                # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd
                pb = ctypes.create_string_buffer(struct.pack("<Qi", rights, fd), 12)
                if _libc.syscall(_nr(1), ctypes.c_int(rs), ctypes.c_int(_RULE_PATH_BENEATH), pb,
                                 ctypes.c_uint32(0)) < 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"landlock_add_rule {path}: {os.strerror(e)}")
            finally:
                os.close(fd)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PR_SET_NO_NEW_PRIVS: {os.strerror(e)}")
        if _libc.syscall(_nr(2), ctypes.c_int(rs), ctypes.c_uint32(0)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(rs)
    return f"landlock ABI {version}"


def drop_capabilities() -> None:
    """Drop every capability (a process started as root keeps uid 0 but loses its powers: no
    reading other processes' /proc files or memory, no bypassing file permissions)."""
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = struct.pack("<Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty __user_cap_data_struct
    _libc.capset(ctypes.create_string_buffer(header, 8), ctypes.create_string_buffer(data, 24))


def not_dumpable() -> None:
    """No process of this user (without CAP_SYS_PTRACE) may read this one's memory or its
    /proc/PID/environ: where the API key of the parent lives."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def seccomp(bpf: bytes) -> None:
    """Install a compiled seccomp filter (struct sock_filter array) on this process and every
    thread of it; it is inherited across fork and exec."""
    if not bpf or len(bpf) % 8:
        raise ValueError("not a seccomp filter")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"PR_SET_NO_NEW_PRIVS: {os.strerror(e)}")
    prog = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = struct.pack("<HxxxxxxQ", len(bpf) // 8, ctypes.addressof(prog))
    arg = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.syscall(_nr(3), ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC),
                     arg) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp: {os.strerror(e)}")


def _which(name: str, path: str) -> str | None:
    if "/" in name:
        return name
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def main(argv: list[str]) -> int:
    """``jail.py SPEC -- program args...``: confine this process as SPEC (JSON) says, then execute
    the program. SPEC: {"read_exec": [paths], "read_write": [paths], "bpf": hex, "landlock": bool,
    "env": {...}, "cwd": path}. What was applied, or why Landlock was not, goes to the file
    descriptor SPEC names in "report_fd" (one line, before the exec) when it names one."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: jail.py SPEC -- program [args...]", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    env = spec.get("env", {})
    program = argv[2:]
    exe = _which(program[0], env.get("PATH", os.defpath))  # before Landlock: it may hide PATH's folders
    if exe is None:
        print(f"jail: {program[0]}: not found on PATH", file=sys.stderr)
        return 127
    note = "landlock not requested"
    if spec.get("landlock", True):
        rules = [(READ_EXEC, p) for p in spec.get("read_exec", [])]
        rules += [(READ_WRITE | LL_EXECUTE, p) for p in spec.get("read_write", [])]
        rules += [(LL_READ_FILE | LL_WRITE_FILE, p) for p in spec.get("devices", [])]
        try:
            note = landlock(rules)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                print(f"jail: {exc}", file=sys.stderr)
                return 125
            note = f"landlock unavailable ({exc.strerror})"
    drop_capabilities()
    if spec.get("bpf"):
        try:
            seccomp(bytes.fromhex(spec["bpf"]))
        except OSError as exc:
            print(f"jail: {exc}", file=sys.stderr)
            return 125
    fd = spec.get("report_fd")
    if isinstance(fd, int) and fd > 2:
        try:
            os.write(fd, (note + "\n").encode())
            os.close(fd)
        except OSError:
            pass
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    try:
        os.execve(exe, program, env)
    except OSError as exc:
        print(f"jail: cannot run {program[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
