"""The record of one conversation, written after every step.

Each entry is one JSON line appended to ``transcript.jsonl`` in the conversation's working
directory and flushed to disk at once, so a crash (or ``kill -9``) mid-conversation keeps
everything said up to the last step; the search commits the entries on the node's branch
(``transcript.json``) when the child is recorded, and commits what an interrupted conversation
left when the next run starts. Every string passes through ``redact`` first: an API key never
reaches the disk, git, or a log.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from .. import safeio

NAME = "transcript.jsonl"


class Transcript:
    def __init__(self, path: Path | None, redact: Callable[[str], str] = lambda s: s) -> None:
        """``path`` None keeps the entries in memory only."""
        self.path = path
        self.redact = redact
        self.entries: list[dict[str, Any]] = []

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self._clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._clean(v) for v in value]
        return value

    def add(self, kind: str, **data: Any) -> dict[str, Any]:
        entry: dict[str, Any] = self._clean({"type": kind, "t": round(time.time(), 3), **data})
        self.entries.append(entry)
        if self.path is not None:
            line = json.dumps(entry, default=str, ensure_ascii=False) + "\n"
            # O_NOFOLLOW: a link put in the conversation's folder in place of the transcript is
            # refused (OSError), never written through
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        return entry


MAX_BYTES = 256 << 20
"""A transcript file larger than this is not read back."""


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The entries of a transcript file (read through ``safeio``: a link in its place gives none);
    a last line cut short by a crash is left out."""
    out: list[dict[str, Any]] = []
    try:
        text = safeio.read_beside(path, limit=MAX_BYTES).decode(errors="replace")
    except (OSError, safeio.Refused):
        return out
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def cost_of(entries: list[dict[str, Any]]) -> float:
    """Money the queries of a transcript cost."""
    return sum(float(e.get("cost_usd", 0.0)) for e in entries if e.get("type") == "query")
