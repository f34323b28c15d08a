"""Reading files the agent could have touched, without following a link.

Every read or copy of a file in a folder that generated code, the LLM's tools or anything outside
forge could have changed (a conversation's working directory: drafts, siblings' sources, submitted
sources, notes, the reference) goes through this module. A path is taken relative to a folder the
caller trusts (``root``) and opened from a descriptor of that folder one component at a time with
``O_NOFOLLOW``, so a symbolic link anywhere in it, one that was there or one swapped in between two
calls, is refused (``Refused``, whose message names the path and why) rather than followed out of
the folder. Only regular files are read (a FIFO would block, a device would never end), up to a
size limit checked before and while reading.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
DEFAULT_LIMIT = 16 << 20


class Refused(Exception):
    """A path that is not read (a link, ``..``, not a regular file, too big, missing): the message
    says which and why."""


class Missing(Refused):
    """The path names nothing (no link either)."""


def _show(path: str) -> str:
    return repr(path if len(path) <= 120 else path[:120] + "…")


def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """The components of a relative path inside the root folder, or ``Refused`` saying why the
    path is refused (absolute, ``..``, NUL or control characters, over-long)."""
    shown = _show(path)
    if "\x00" in path:
        raise Refused(f"path {shown} contains a NUL byte")
    if not path.strip():
        raise Refused("empty path: name a file relative to the working directory")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise Refused(f"path {shown} is not valid text") from None
    if size > MAX_PATH_BYTES:
        raise Refused(f"path is {size} bytes long, over the {MAX_PATH_BYTES}-byte limit")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise Refused(f"path {shown} contains control characters")
    if path.startswith("/"):
        raise Refused(f"{shown} is an absolute path: paths are relative to the working directory "
                      "(for example candidate.cpp or sub/notes.md)")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{shown} contains '..': paths must stay inside the working directory")
    for p in parts:
        if len(p.encode("utf-8")) > MAX_NAME_BYTES:
            raise Refused(f"a name in {shown} is {len(p.encode('utf-8'))} bytes long, over the "
                          f"{MAX_NAME_BYTES}-byte limit")
    if not parts and not allow_root:
        raise Refused(f"{shown} is the working directory itself, not a file")
    return parts


def refusal(dir_fd: int, name: str, rel: str, exc: OSError, *, want_dir: bool) -> Refused:
    """Why opening ``name`` (in the folder ``dir_fd``, shown as ``rel``) failed, in words."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return Refused(f"{rel} is a symbolic link: links are not followed (one may lead outside the "
                       "working directory)")
    if exc.errno == errno.ENOENT:
        return Missing(f"{rel}: no such {'folder' if want_dir else 'file'} (list_files shows what there is)")
    if want_dir and st is not None and not stat.S_ISDIR(st.st_mode):
        return Refused(f"{rel} is a file, not a folder")
    if exc.errno == errno.ELOOP:
        return Refused(f"{rel} is a symbolic link: links are not followed")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Refused(f"{rel}: permission denied")
    return Refused(f"{rel}: {exc.strerror or type(exc).__name__}")


def open_root(root: Path | str) -> int:
    """A descriptor of the trusted folder itself (the caller made or chose it)."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"the working directory cannot be opened: {exc.strerror}") from None


def open_dir(root: Path | str, parts: list[str], *, create: bool = False) -> int:
    """A descriptor of the folder ``parts`` inside ``root``, reached one component at a time
    without following links (and made, with ``create``, where missing)."""
    fd = open_root(root)
    try:
        for i, name in enumerate(parts):
            rel = "/".join(parts[: i + 1])
            try:
                nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError as exc:
                if not create:
                    raise refusal(fd, name, rel, exc, want_dir=True) from None
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc2:
                    raise refusal(fd, name, rel, exc2, want_dir=True) from None
                try:
                    nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as exc2:
                    raise refusal(fd, name, rel, exc2, want_dir=True) from None
            except OSError as exc:
                raise refusal(fd, name, rel, exc, want_dir=True) from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_bytes(root: Path | str, path: str, *, limit: int = DEFAULT_LIMIT) -> tuple[str, bytes]:
    """(the normalised relative path, its bytes): a regular file inside ``root``, reached without
    following a link, at most ``limit`` bytes long."""
    parts = split_path(path)
    rel = "/".join(parts)
    dfd = open_dir(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            raise refusal(dfd, parts[-1], rel, exc, want_dir=False) from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"{rel} is a folder: list_files shows what is in it")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{rel} is not a regular file")
        if st.st_size > limit:
            raise Refused(f"{rel} is {st.st_size} bytes, over the {limit}-byte limit")
        chunks = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise Refused(f"{rel} is over the {limit}-byte limit")
        return rel, data
    finally:
        os.close(fd)


def read_text(root: Path | str, path: str, *, limit: int = DEFAULT_LIMIT, strict: bool = True) -> tuple[str, str]:
    """(the normalised relative path, its text). ``strict``: binary content (a NUL byte, or not
    UTF-8) is refused; otherwise undecodable bytes are replaced."""
    rel, data = read_bytes(root, path, limit=limit)
    if not strict:
        return rel, data.decode("utf-8", errors="replace")
    if b"\x00" in data:
        raise Refused(f"{rel} is binary ({len(data)} bytes): only text is read")
    try:
        return rel, data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(f"{rel} is binary or not UTF-8 ({len(data)} bytes): only text is read") from None


def read_beside(path: Path | str, *, limit: int = DEFAULT_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, refused when its last component is a link; the
    folder holding it is trusted (the caller made it). For a file the agent could have replaced in
    a folder forge owns (a transcript, a draft)."""
    p = Path(path)
    return read_bytes(p.parent, p.name, limit=limit)[1]
