"""The one place that talks to git (GitPython): fixed identity, structured trailers, errors caught here.

Commits on ``main`` go through the working tree. Search commits (issue 4) are written with
plumbing onto their own branches without touching the working tree, so several can be written
while the user looks at ``main``.
"""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .errors import WorkspaceError


def _git_errors() -> tuple[type[BaseException], ...]:
    """Every error that can come out of git, GitPython or gitdb (and the file system under them)."""
    import git
    import gitdb.exc

    return (git.GitError, gitdb.exc.ODBError, ValueError, OSError)


@contextmanager
def git_boundary(action: str) -> Iterator[None]:
    """Turns any git, gitdb or file-system error raised inside into one WorkspaceError naming
    ``action``: the one place where git's failures become messages."""
    try:
        yield
    except WorkspaceError:
        raise
    except _git_errors() as exc:
        raise WorkspaceError(f"git failed while {action}: {type(exc).__name__}: {exc}") from exc


class RefConflict(WorkspaceError):
    """A ref write refused: the ref exists (create-only write) or moved since it was read."""

    def __init__(self, message: str, ref: str = "") -> None:
        super().__init__(message)
        self.ref = ref


class SecretInCommit(WorkspaceError):
    """A file about to be committed holds a secret (an API key, a token): nothing is committed."""


def refuse_secrets(files: Iterable[tuple[str, bytes]]) -> None:
    """SecretInCommit naming the first file that holds a secret of the environment or a key-shaped
    text (``forge_tui.redaction.find_secrets``), and which one: the variable or the kind of key,
    never the value."""
    from .redaction import find_secrets

    for path, data in files:
        found = find_secrets(data)
        if found:
            raise SecretInCommit(f"refusing to commit {path}: it holds {', '.join(found)} (not shown); "
                                 "nothing was committed: remove the secret first")


AUTHOR_NAME = "forge-tui"
AUTHOR_EMAIL = "forge-tui@localhost"
TRAILER_RE = re.compile(r"^([A-Z][A-Za-z0-9-]*): (.*)$")

_GIT_ENV = {
    "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
    "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
}


def format_message(subject: str, body: str = "", trailers: dict[str, object] | None = None) -> str:
    parts = [subject.strip()]
    if body.strip():
        parts.append(body.strip())
    if trailers:
        parts.append("\n".join(f"{k}: {v}" for k, v in trailers.items()))
    return "\n\n".join(parts) + "\n"


def parse_trailers(message: str) -> dict[str, str]:
    """Trailers of the last paragraph of a commit message."""
    last = message.strip().split("\n\n")[-1]
    out: dict[str, str] = {}
    for line in last.splitlines():
        m = TRAILER_RE.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


class GitRepo:
    def __init__(self, repo) -> None:
        self._repo = repo

    @property
    def root(self) -> Path:
        return Path(self._repo.working_tree_dir)

    @classmethod
    @contextmanager
    def open(cls, path: Path) -> Iterator["GitRepo"]:
        import git

        try:
            repo = git.Repo(path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise WorkspaceError(f"{path} is not a git repository ({type(exc).__name__})") from None
        try:
            yield cls(repo)
        finally:
            repo.close()

    @classmethod
    @contextmanager
    def init(cls, path: Path) -> Iterator["GitRepo"]:
        import git

        repo = git.Repo.init(path, initial_branch="main")
        with repo.config_writer() as cw:
            cw.set_value("user", "name", AUTHOR_NAME)
            cw.set_value("user", "email", AUTHOR_EMAIL)
            cw.set_value("gc", "auto", "0")
        try:
            yield cls(repo)
        finally:
            repo.close()

    def git(self, *args: str) -> str:
        import git

        try:
            return self._repo.git.execute(["git", *args], env={**os.environ, **_GIT_ENV})
        except git.GitCommandError as exc:
            raise WorkspaceError(f"git {args[0]} failed in {self.root}: {exc.stderr.strip() or exc}") from None

    def commit_worktree(self, subject: str, body: str = "", trailers: dict | None = None) -> str:
        """Stage everything in the working tree (respecting .gitignore) and commit on the current
        branch; SecretInCommit, with everything unstaged again, when a file staged holds a secret."""
        self.git("add", "-A")
        message = format_message(subject, body, trailers)
        try:
            refuse_secrets([("the commit message", message.encode()), *self._staged()])
        except SecretInCommit:
            self.git("reset", "-q")
            raise
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def _staged(self) -> list[tuple[str, bytes]]:
        """(path, content as staged) of every file added or changed in the index, read in one
        ``git cat-file --batch``."""
        names = [n for n in self.git("diff", "--cached", "--name-only", "-z", "--no-renames",
                                     "--diff-filter=d").split("\0") if n]
        if not names:
            return []
        request = "".join(f":{n}\n" for n in names).encode()
        with git_boundary("reading the files staged for the commit"):
            out = subprocess.run(["git", "cat-file", "--batch"], cwd=self.root, input=request, capture_output=True,
                                 env={**os.environ, **_GIT_ENV}, check=True).stdout
        files: list[tuple[str, bytes]] = []
        at = 0
        for name in names:
            end = out.index(b"\n", at)
            head = out[at:end].split()
            at = end + 1
            if len(head) == 3:
                size = int(head[2])
                files.append((name, out[at:at + size]))
                at += size + 1
            else:  # "<name> missing": a name git cannot quote on one line; its file is read whole
                files.append((name, (self.root / name).read_bytes() if not (self.root / name).is_symlink()
                              else os.readlink(self.root / name).encode()))
        return files

    def git_warnings(self, *args: str) -> tuple[str, list[str]]:
        """Like :meth:`git`, and also what git printed on stderr (e.g. ``ignoring broken ref``)."""
        import git

        try:
            _, out, err = self._repo.git.execute(["git", *args], env={**os.environ, **_GIT_ENV},
                                                 with_extended_output=True)
        except git.GitCommandError as exc:
            raise WorkspaceError(f"git {args[0]} failed in {self.root}: {exc.stderr.strip() or exc}") from None
        return out, [line.strip() for line in err.splitlines() if line.strip()]

    def head(self, ref: str = "HEAD") -> str:
        return self.git("rev-parse", ref)

    def read_ref(self, ref: str) -> str | None:
        """What ``ref`` holds (its loose file, else its ``packed-refs`` line), neither resolved nor
        checked: works when the object is missing or the file is garbage. ``None`` when there is none."""
        common = Path(self._repo.common_dir)
        path = common / ref
        if path.is_file():
            return path.read_text(errors="replace").strip()
        try:
            packed = (common / "packed-refs").read_text(errors="replace")
        except OSError:
            return None
        for line in packed.splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref and not line.startswith(("#", "^")):
                return sha
        return None

    def read_object(self, sha: str) -> tuple[str, bytes]:
        """An object's type and content (loose or packed, through GitPython's persistent ``cat-file``);
        WorkspaceError when it is missing or corrupt."""
        try:
            stream = self._repo.odb.stream(bytes.fromhex(sha))
            return stream.type.decode(), stream.read()
        except Exception:  # noqa: BLE001 - ValueError (missing, corrupt, not hex) and friends
            raise WorkspaceError(f"object {sha[:40]!r} is missing or unreadable") from None

    def delete_ref(self, ref: str) -> None:
        """Remove a ref; a broken one (its file holds no object id, git refuses it) by removing its file."""
        try:
            self.git("update-ref", "--no-deref", "-d", ref)
        except WorkspaceError:
            check_ref_name(ref)
            path = Path(self._repo.common_dir) / ref
            if not path.is_file():
                raise
            path.unlink()

    def log(self, ref: str = "main", fmt: str = "%H%x00%B%x00") -> list[tuple[str, str]]:
        out = self.git("log", f"--format={fmt}", ref)
        fields = out.split("\x00")
        return [(fields[i].strip(), fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


# ---- plumbing: commits written in-process, no working tree --------------------------------------
class ObjectWriter:
    """Writes blobs, trees and commits as loose objects (gitdb, in-process, no subprocess) and
    writes refs through git's lock-file protocol (compare-and-swap, never a blind overwrite), so
    recording a search node spawns nothing.

    Not thread-safe by design: the search commits from one thread.
    """

    def __init__(self, repo: GitRepo) -> None:
        from gitdb.db import LooseObjectDB

        self.repo = repo
        self._odb = LooseObjectDB(str(Path(repo._repo.git_dir) / "objects"))
        self._trees: dict[str, list] = {}

    def _store(self, kind: bytes, data: bytes) -> bytes:
        from io import BytesIO

        from gitdb import IStream

        with git_boundary(f"writing a {kind.decode()} object"):
            return self._odb.store(IStream(kind, len(data), BytesIO(data))).binsha

    def blob(self, data: bytes) -> bytes:
        return self._store(b"blob", data)

    def tree(self, entries: list[tuple[str, bytes, str]]) -> bytes:
        """entries: (mode, binsha, name); git's order (directories sort as if they ended in '/')."""
        def key(e):
            return e[2] + ("/" if e[0] == "40000" else "")

        data = b"".join(f"{mode} {name}".encode() + b"\0" + sha for mode, sha, name in sorted(entries, key=key))
        return self._store(b"tree", data)

    def _read(self, binsha: bytes) -> bytes:
        """An object's content: loose objects directly, packed ones through git."""
        with git_boundary(f"reading object {binsha.hex()[:12]}"):
            if self._odb.has_object(binsha):
                return self._odb.stream(binsha).read()
            return self.repo._repo.odb.stream(binsha).read()

    def tree_entries(self, commit_hex: str) -> list[tuple[str, bytes, str]]:
        """Top-level entries of a commit's tree (cached)."""
        if commit_hex not in self._trees:
            from git.objects.fun import tree_entries_from_data

            raw = self._read(bytes.fromhex(commit_hex))
            tree_hex = raw.split(b"\n", 1)[0].split(b" ", 1)[1].decode()
            data = self._read(bytes.fromhex(tree_hex))
            self._trees[commit_hex] = [(format(mode, "o"), sha, name)
                                       for sha, mode, name in tree_entries_from_data(data)]
        return self._trees[commit_hex]

    def commit(self, tree: bytes, parents: list[str], message: str, when: int | None = None) -> str:
        import time as _time

        ts = int(_time.time()) if when is None else when
        ident = f"{AUTHOR_NAME} <{AUTHOR_EMAIL}> {ts} +0000"
        lines = [f"tree {tree.hex()}"] + [f"parent {p}" for p in parents] + [f"author {ident}", f"committer {ident}", "",
                                                                              message]
        return self._store(b"commit", "\n".join(lines).encode()).hex()

    def commit_files(self, base_commit: str | None, folder: str, files: dict[str, bytes], parents: list[str],
                     message: str) -> str:
        """A commit whose tree is ``base_commit``'s with ``folder/`` replaced by ``files``;
        SecretInCommit, having written nothing, when one of them holds a secret."""
        refuse_secrets([("the commit message", message.encode()),
                        *((f"{folder}/{name}", data) for name, data in files.items())])
        sub = self.tree([("100644", self.blob(data), name) for name, data in files.items()])
        entries = [e for e in (self.tree_entries(base_commit) if base_commit else []) if e[2] != folder]
        entries.append(("40000", sub, folder))
        return self.commit(self.tree(entries), parents, message)

    def update_ref(self, ref: str, sha: str, old: str | None) -> None:
        """Point ``ref`` at ``sha`` only if it now holds ``old`` (``None``: only if it does not exist).

        Git's lock-file protocol, in-process: ``<ref>.lock`` is created exclusively, the ref's value
        (loose file, else ``packed-refs``) is checked while the lock is held, then the lock file is
        renamed over the ref (atomic). A ref that exists, or moved since it was read, makes the write
        fail with :class:`RefConflict` instead of being replaced; nothing is ever overwritten blindly.
        """
        from gitdb.util import LockedFD

        check_ref_name(ref)
        path = Path(self.repo._repo.common_dir) / ref
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RefConflict(f"cannot write {short_ref(ref)}: {exc}", ref) from None
        lock = LockedFD(str(path))
        try:
            out = lock.open(write=True, stream=True)
        except OSError:
            raise RefConflict(f"cannot write {short_ref(ref)}: {path}.lock exists (another process is writing it, "
                              "or one was killed while it did: remove the lock file if none runs)", ref) from None
        try:
            current = self.repo.read_ref(ref)
            if current != old:
                if old is None:
                    raise RefConflict(f"refusing to overwrite {short_ref(ref)}: it already exists "
                                      f"(at {(current or '')[:12]})", ref)
                raise RefConflict(f"refusing to move {short_ref(ref)}: it is at {(current or 'nothing')[:12]}, "
                                  f"expected {old[:12]} (written by someone else meanwhile?)", ref)
            with git_boundary(f"moving {short_ref(ref)}"):
                out.write(f"{sha}\n".encode())
                lock.commit()
        except BaseException:
            lock.rollback()
            raise


def for_each_ref(repo: GitRepo, prefix: str) -> list[tuple[str, str, str]]:
    """(refname, commit, message) of every ref under ``prefix``, in one git call."""
    out = repo.git("for-each-ref", "--format=%(refname)%00%(objectname)%00%(contents)%00%00", prefix)
    rows = []
    for chunk in out.split("\x00\x00"):
        chunk = chunk.lstrip("\n")
        if not chunk:
            continue
        parts = chunk.split("\x00", 2)
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def read_blob(repo: GitRepo, commit: str, path: str) -> bytes | None:
    """A file of a commit; ``None`` when the commit has no such file, WorkspaceError when an object
    on the way (commit, tree, blob) is missing or unreadable."""
    try:
        obj = repo._repo.commit(commit).tree / path
        return obj.data_stream.read()
    except KeyError:
        return None
    except Exception as exc:  # noqa: BLE001 - gitdb/GitPython raise ValueError, BadObject, ... for damage
        raise WorkspaceError(f"cannot read {path} at {commit[:12]}: {type(exc).__name__}: {exc}") from None


# ---- damage-tolerant reading --------------------------------------------------------------------
def short_ref(ref: str) -> str:
    """``refs/heads/search/a/n1`` -> ``search/a/n1`` (the branch name people see)."""
    return ref[len("refs/heads/"):] if ref.startswith("refs/heads/") else ref


def check_ref_name(ref: str) -> None:
    """The rules of git-check-ref-format that matter for a file path (no traversal, no lock names)."""
    parts = ref.split("/")
    if not ref.startswith("refs/") or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts) or \
            ".." in ref or "@{" in ref or ref.endswith(".") or any(c in ref for c in " ~^:?*[\\") or \
            any(ord(c) < 32 or ord(c) == 127 for c in ref):
        raise WorkspaceError(f"not a valid ref name: {ref!r}")


def commit_parts(data: bytes) -> tuple[list[str], str]:
    """A raw commit object's parents and message."""
    head, _, message = data.partition(b"\n\n")
    parents = [line[7:].decode().strip() for line in head.split(b"\n") if line.startswith(b"parent ")]
    return parents, message.decode("utf-8", "replace")


@dataclass
class RefInfo:
    """A ref and what it points at; ``error`` says why it cannot be read (then ``message`` is None)."""

    ref: str
    sha: str
    kind: str | None = None
    """The object's type (``commit`` for a sound branch)."""
    message: str | None = None
    """The commit's message (commits only)."""
    error: str | None = None


_BROKEN_RE = re.compile(r"ignoring broken ref (\S+)")


def list_refs(repo: GitRepo, *patterns: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(refname, value) of refs matching ``patterns`` without reading their objects (works when an
    object is missing), and the names git ignores as broken (a ref file that holds no object id)."""
    out, warnings = repo.git_warnings("for-each-ref", "--format=%(refname)%00%(objectname)", *patterns)
    rows = [(a, b) for a, _, b in (line.partition("\x00") for line in out.splitlines() if "\x00" in line)]
    broken = [m.group(1) for w in warnings if (m := _BROKEN_RE.search(w))]
    return rows, [r for r in broken if any(_ref_matches(r, p) for p in patterns)]


def _ref_matches(ref: str, pattern: str) -> bool:
    """for-each-ref's pattern rule: fnmatch, or the whole name, or a prefix up to a slash."""
    from fnmatch import fnmatchcase

    return fnmatchcase(ref, pattern) or ref == pattern or ref.startswith(pattern.rstrip("/") + "/")


def scan_refs(repo: GitRepo, prefix: str) -> list[RefInfo]:
    """Every ref under ``prefix`` with its commit message: one git call while the objects are sound;
    when one is missing or corrupt (git then fails the whole call), each object is read on its own
    through GitPython's persistent ``cat-file`` and the bad ones come back with ``error`` set. Refs
    git ignores as broken come back too, with ``error`` set."""
    rows: list[RefInfo] = []
    try:
        out, warnings = repo.git_warnings(
            "for-each-ref", "--format=%(refname)%00%(objectname)%00%(objecttype)%00%(contents)%00%00", prefix)
    except WorkspaceError:
        pairs, broken = list_refs(repo, prefix)
        for ref, sha in pairs:
            try:
                kind, data = repo.read_object(sha)
            except WorkspaceError:
                rows.append(RefInfo(ref, sha, error=f"points at {sha[:12]}, an object that is missing or unreadable"))
                continue
            rows.append(RefInfo(ref, sha, kind, commit_parts(data)[1] if kind == "commit" else None))
    else:
        broken = [m.group(1) for w in warnings if (m := _BROKEN_RE.search(w))]
        for chunk in out.split("\x00\x00"):
            chunk = chunk.lstrip("\n")
            if not chunk:
                continue
            parts = chunk.split("\x00", 3)
            if len(parts) == 4:
                rows.append(RefInfo(parts[0], parts[1], parts[2], parts[3] if parts[2] == "commit" else None))
    for ref in broken:
        if _ref_matches(ref, prefix):
            rows.append(RefInfo(ref, repo.read_ref(ref) or "", error="the ref is broken (its file holds no object id)"))
    return rows


def walk_first_parent(repo: GitRepo, tip: str) -> tuple[list[tuple[str, str]], str | None, str | None]:
    """(commit, message) from ``tip`` down its first parents, newest first, read one object at a time
    (for a chain ``git log`` cannot walk); then why the walk stopped early and at which object, if it did."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    sha: str | None = tip
    while sha and sha not in seen:
        seen.add(sha)
        try:
            kind, data = repo.read_object(sha)
        except WorkspaceError:
            below = f", the parent of {out[-1][0][:12]}," if out else ""
            return out, f"commit {sha[:12]}{below} is missing or unreadable: the events before it cannot be read", sha
        if kind != "commit":
            return out, f"{sha[:12]} is a {kind}, not a commit: the events before it cannot be read", sha
        parents, message = commit_parts(data)
        out.append((sha, message))
        sha = parents[0] if parents else None
    return out, None, None
