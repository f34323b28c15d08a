"""The one place that talks to git (GitPython): fixed identity, structured trailers, errors caught here.

Commits on ``main`` go through the working tree. Search commits (issue 4) are written with
plumbing onto their own branches without touching the working tree, so several can be written
while the user looks at ``main``.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import WorkspaceError

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
        """Stage everything in the working tree (respecting .gitignore) and commit on the current branch."""
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", format_message(subject, body, trailers))
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return self.git("rev-parse", ref)

    def log(self, ref: str = "main", fmt: str = "%H%x00%B%x00") -> list[tuple[str, str]]:
        out = self.git("log", f"--format={fmt}", ref)
        fields = out.split("\x00")
        return [(fields[i].strip(), fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


# ---- plumbing: commits written in-process, no working tree --------------------------------------
class ObjectWriter:
    """Writes blobs, trees and commits as loose objects (gitdb, in-process, no subprocess) and
    moves refs through GitPython's lock-file protocol, so recording a search node spawns nothing.

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
        """A commit whose tree is ``base_commit``'s with ``folder/`` replaced by ``files``."""
        sub = self.tree([("100644", self.blob(data), name) for name, data in files.items()])
        entries = [e for e in (self.tree_entries(base_commit) if base_commit else []) if e[2] != folder]
        entries.append(("40000", sub, folder))
        return self.commit(self.tree(entries), parents, message)

    def set_ref(self, ref: str, sha: str) -> None:
        """Point ``ref`` at ``sha`` (written to a lock file, then renamed: atomic)."""
        import git

        git.Reference.create(self.repo._repo, ref, sha, force=True, logmsg=None)


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
    try:
        obj = repo._repo.commit(commit).tree / path
    except KeyError:
        return None
    return obj.data_stream.read()
