"""File tools confined to the node's working directory: read_file, write_file, edit_file, list_files.

Every path is relative to ``ToolEnv.workdir`` and opened without a shell and without following a
link: from a descriptor of the working directory, one component at a time (``openat`` with
``O_NOFOLLOW``), so a symbolic link anywhere in a path, one that was there or one swapped in
between two calls, is refused rather than followed out of the directory. Writes go to a new file
beside the target, renamed over it: a hard link to a file elsewhere is replaced, not written
through. Reading and the walk through the folders are ``forge_tui.safeio``'s, the one no-follow
helper every read of a file the agent could have touched goes through. Every refusal is a
``ToolError`` that tells the model why.
"""

from __future__ import annotations

import os
import secrets
import stat
from contextlib import contextmanager
from typing import Iterator

from pydantic import Field

from forge_tui import safeio

from .base import Params, Tool, ToolEnv, ToolError

READ_CHARS = 24_000
"""What one read_file answer shows at most (the rest: another call with offset_line)."""
MAX_LIST = 500
MAX_LINE_CHARS = 2000

_TMP_PREFIX = ".forge-write-"


@contextmanager
def _told() -> Iterator[None]:
    """A refusal of the no-follow helper, as the model reads it."""
    try:
        yield
    except safeio.Refused as exc:
        raise ToolError(str(exc)) from None


# ---- paths ------------------------------------------------------------------------------------
def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """The components of a relative path inside the working directory, or a ToolError saying why
    the path is refused."""
    with _told():
        return safeio.split_path(path, allow_root=allow_root)


def _is_read_only(env: ToolEnv, rel: str) -> bool:
    return any(rel == ro or rel.startswith(ro + "/") for ro in env.read_only)


def _open_dir(env: ToolEnv, parts: list[str], *, create: bool = False) -> int:
    """A descriptor of the folder ``parts`` inside the working directory (``safeio.open_dir``)."""
    with _told():
        return safeio.open_dir(env.workdir, parts, create=create)


def read_bytes(env: ToolEnv, path: str) -> tuple[str, bytes]:
    """(the normalised relative path, its bytes): a regular file inside the working directory, at
    most ``env.max_read_bytes`` long, read without following a link (``safeio.read_bytes``)."""
    with _told():
        return safeio.read_bytes(env.workdir, path, limit=env.max_read_bytes)


def read_text(env: ToolEnv, path: str) -> tuple[str, str]:
    """(the normalised relative path, its text); binary content is refused."""
    with _told():
        return safeio.read_text(env.workdir, path, limit=env.max_read_bytes)


def write_text(env: ToolEnv, path: str, content: str) -> tuple[str, int]:
    """Write ``content`` to ``path`` (made with its folders if missing); (the normalised relative
    path, the bytes written)."""
    parts = split_path(path)
    rel = "/".join(parts)
    if _is_read_only(env, rel):
        raise ToolError(f"{rel} is read-only (context to read, not to change): write your kernel to "
                        f"{env.source_name} or to a new file")
    if "\x00" in content:
        raise ToolError("the content contains a NUL byte: the file tools write text only")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("the content is not valid text (an unpaired surrogate)") from None
    if len(data) > env.max_write_bytes:
        raise ToolError(f"the content is {len(data)} bytes, over the {env.max_write_bytes}-byte limit of write_file")
    name = parts[-1]
    dfd = _open_dir(env, parts[:-1], create=True)
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise ToolError(f"{rel} is a symbolic link: file tools do not follow or replace links")
            if stat.S_ISDIR(st.st_mode):
                raise ToolError(f"{rel} is a folder")
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{rel} is not a regular file")
        tmp = _TMP_PREFIX + secrets.token_hex(6)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        except OSError as exc:
            raise ToolError(f"{rel} cannot be written: {exc.strerror}") from None
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise ToolError(f"{rel} cannot be written: {exc.strerror}") from None
            raise
    finally:
        os.close(dfd)
    return rel, len(data)


# ---- the tools --------------------------------------------------------------------------------
class ReadFileParams(Params):
    path: str = Field(description="File to read, relative to the working directory (e.g. candidate.cpp, card.json).")
    offset_line: int = Field(1, ge=1, description="First line to show (1-based).")
    max_lines: int = Field(400, ge=1, le=5000, description="At most this many lines.")


def read_file(env: ToolEnv, p: ReadFileParams) -> str:
    rel, text = read_text(env, p.path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    n = len(lines)
    if n == 0:
        return f"{rel}: empty file (0 bytes)"
    if p.offset_line > n:
        raise ToolError(f"{rel} has {n} lines; offset_line {p.offset_line} is past its end")
    shown: list[str] = []
    used = 0
    last = p.offset_line - 1
    for i in range(p.offset_line - 1, min(n, p.offset_line - 1 + p.max_lines)):
        line = lines[i].rstrip("\r")
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" [... line cut at {MAX_LINE_CHARS} of {len(line)} characters]"
        entry = f"{i + 1:>6}\t{line}"
        if shown and used + len(entry) + 1 > READ_CHARS:
            break
        shown.append(entry)
        used += len(entry) + 1
        last = i + 1
    head = f"{rel}: lines {p.offset_line}-{last} of {n} ({len(text.encode())} bytes)"
    if _is_read_only(env, rel):
        head += ", read-only"
    tail = [f"[{n - last} more lines: read_file with offset_line={last + 1}]"] if last < n else []
    return "\n".join([head, *shown, *tail])


class WriteFileParams(Params):
    path: str = Field(description="File to write, relative to the working directory; folders are made as needed.")
    content: str = Field(description="The whole new content of the file (text).")


def write_file(env: ToolEnv, p: WriteFileParams) -> str:
    rel, n = write_text(env, p.path, p.content)
    lines = p.content.count("\n") + (0 if p.content.endswith("\n") or not p.content else 1)
    return f"wrote {rel} ({n} bytes, {lines} lines)"


class EditFileParams(Params):
    path: str = Field(description="File to edit, relative to the working directory.")
    old: str = Field(min_length=1, description="Text to replace: must occur exactly once in the file, "
                     "whitespace and indentation included (add surrounding lines to make it unique).")
    new: str = Field(description="Text to put in its place.")


def edit_file(env: ToolEnv, p: EditFileParams) -> str:
    parts = split_path(p.path)
    rel = "/".join(parts)
    if _is_read_only(env, rel):
        raise ToolError(f"{rel} is read-only (context to read, not to change): write your kernel to "
                        f"{env.source_name} or to a new file")
    rel, text = read_text(env, rel)
    count = text.count(p.old)
    if count == 0:
        raise ToolError(f"old text found 0 times in {rel}: it must match the file exactly, whitespace and "
                        "indentation included (read_file shows the file)")
    if count > 1:
        raise ToolError(f"old text found {count} times in {rel}: it must occur exactly once; include more of the "
                        "surrounding lines")
    if p.old == p.new:
        raise ToolError("old and new are the same: nothing to change")
    at = text.index(p.old)
    line = text.count("\n", 0, at) + 1
    _, n = write_text(env, rel, text[:at] + p.new + text[at + len(p.old):])
    return (f"edited {rel} at line {line}: replaced {p.old.count(chr(10)) + 1} line(s) with "
            f"{p.new.count(chr(10)) + 1} line(s); the file is now {n} bytes")


class ListFilesParams(Params):
    path: str = Field(".", description="Folder to list, relative to the working directory.")


def list_files(env: ToolEnv, p: ListFilesParams) -> str:
    parts = split_path(p.path, allow_root=True)
    rel = "/".join(parts) or "."
    dfd = _open_dir(env, parts)
    rows: list[str] = []
    try:
        try:
            with os.scandir(dfd) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise ToolError(f"{rel} cannot be listed: {exc.strerror}") from None
        for e in entries[:MAX_LIST]:
            name = e.name
            child = name if rel == "." else f"{rel}/{name}"
            ro = " (read-only)" if _is_read_only(env, child) else ""
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                rows.append(f"{name} (unreadable)")
                continue
            if stat.S_ISLNK(st.st_mode):
                rows.append(f"{name}@ (symbolic link, not followed)")
            elif stat.S_ISDIR(st.st_mode):
                rows.append(f"{name}/{ro}")
            elif stat.S_ISREG(st.st_mode):
                rows.append(f"{name}  {st.st_size} bytes{ro}")
            else:
                rows.append(f"{name} (not a regular file)")
    finally:
        os.close(dfd)
    head = f"{rel}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    if len(entries) > MAX_LIST:
        rows.append(f"[... {len(entries) - MAX_LIST} more not shown]")
    return "\n".join([head, *rows]) if rows else f"{rel}: empty folder"


READ_FILE = Tool("read_file", "Read a text file of the working directory, with line numbers. Long files are shown "
                 "in parts: pass offset_line to continue.", ReadFileParams, read_file)
WRITE_FILE = Tool("write_file", "Write a whole text file in the working directory (made if missing, replaced if "
                  "present). Read-only context files cannot be written.", WriteFileParams, write_file)
EDIT_FILE = Tool("edit_file", "Replace one exact, unique piece of text in a file of the working directory "
                 "(cheaper than rewriting the whole file).", EditFileParams, edit_file)
LIST_FILES = Tool("list_files", "List a folder of the working directory: names, sizes, a trailing / for folders.",
                  ListFilesParams, list_files)
