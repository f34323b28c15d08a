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

    def fsck(self) -> str:
        return self.git("fsck", "--strict")
