"""What a candidate's source may include, checked before anything is compiled.

A candidate is one file plus the ABI header (``forge_kernel.h``) and the toolchain's own headers
(the C++ library, CUDA's). Anything else a compile reads could be a file of the user's: its tokens
would come back to the model in the compiler's diagnostics (``'SECRET...' does not name a type``).
Two checks, both before the compile:

* ``source_problems`` reads the text: an ``#include`` (or ``#include_next``, ``__has_include``)
  that is absolute, climbs with ``..``, or names a file that is neither the ABI header nor found in
  the toolchain's include folders is refused, and so is the assembler's ``.incbin`` (which reads a
  file into the object) and C23's ``#embed``;
* ``outside`` checks the preprocessor's dependency list (``-M``, run confined like the compile)
  against the allowed roots, which catches what the text hides (an include through a macro, a
  header that includes further).

Each problem is one line naming the include and why, with its line number.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Sequence

_CONTINUATION = re.compile(r"\\\r?\n")
_DIRECTIVE = re.compile(r'^[ \t]*#[ \t]*(include_next|include|import|embed)\b[ \t]*(?:"([^"\n]*)"|<([^>\n]*)>)?',
                        re.MULTILINE)
_HAS_INCLUDE = re.compile(r'\b(__has_include_next|__has_include|__has_embed)\s*\(\s*(?:"([^"\n]*)"|<([^>\n]*)>)')
_INCBIN = re.compile(r"\.?\bincbin\b")


def _join_continuations(text: str) -> str:
    """Lines continued with a backslash joined into one, the lines they took kept as empty lines
    after it (so every line keeps its number)."""
    out: list[str] = []
    pending: list[str] = []
    for line in text.split("\n"):
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        out.append("".join(pending) + line)
        out.extend([""] * len(pending))
        pending = []
    if pending:
        out.append("".join(pending))
    return "\n".join(out)


_LITERAL_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*["\n]?' r"|'(?:\\.|[^'\\\n])*['\n]?" r"|//[^\n]*|/\*.*?(?:\*/|\Z)",
                                 re.DOTALL)
"""A string or character literal (up to its closing quote or the end of its line; a backslash
takes the next character with it), a line comment (up to the end of its line) or a block comment
(up to its end or the end of the text), whichever starts first."""


def _blank_comment(m: re.Match[str]) -> str:
    text = m.group(0)
    if text[0] in "\"'":
        return text
    return "" if text[1] == "/" else " " + "\n" * text.count("\n")


def _strip_comments(text: str) -> str:
    """Comments blanked out (line numbers kept); string literals are left as they are."""
    return _LITERAL_OR_COMMENT.sub(_blank_comment, text)


def _why_not(name: str, header: str, include_dirs: Sequence[str] | None) -> str | None:
    if not name.strip():
        return "an empty name"
    if name.startswith("/"):
        return "an absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "a path that climbs with '..'"
    if name == header:
        return None
    if include_dirs is None:
        return None
    if not any(os.path.isfile(os.path.join(d, name)) for d in include_dirs):
        return f"neither the ABI header ({header}) nor a header of the toolchain's include folders"
    return None


def source_problems(source: str, header: str, include_dirs: Sequence[str] | None = None) -> list[tuple[int, str]]:
    """(line number, why) of each include the text refuses (see the module's text).
    ``include_dirs`` None: only the path checks (absolute, ``..``), for a caller without the
    compiler's include folders (the static checks)."""
    text = _strip_comments(_join_continuations(source.replace("\r\n", "\n")))
    problems: list[tuple[int, str]] = []

    def line_of(at: int) -> int:
        return text.count("\n", 0, at) + 1

    for m in _DIRECTIVE.finditer(text):
        kind, name = m.group(1), m.group(2) if m.group(2) is not None else m.group(3)
        if kind == "embed":
            problems.append((line_of(m.start()), "#embed reads a file into the program: candidates may not read "
                             "files"))
            continue
        if name is None:
            continue  # an include through a macro: the dependency list shows what it names
        why = _why_not(name, header, include_dirs)
        if why is not None:
            problems.append((line_of(m.start()), f"#{kind} {_shown(name, m)} is refused: {why} (a candidate may "
                             f"include only {header} and the toolchain's headers)"))
    for m in _HAS_INCLUDE.finditer(text):
        name = m.group(2) if m.group(2) is not None else m.group(3)
        why = _why_not(name, header, None)
        if why is not None:
            problems.append((line_of(m.start()), f"{m.group(1)}({_shown(name, m)}) is refused: {why}"))
    incbin = _INCBIN.search(text)
    if incbin is not None:
        problems.append((line_of(incbin.start()), ".incbin makes the assembler read a file into the library: "
                         "candidates may not read files"))
    return problems


def _shown(name: str, m: re.Match[str]) -> str:
    return f'"{name}"' if m.group(2) is not None else f"<{name}>"


def parse_dependencies(text: str) -> list[str]:
    """The prerequisites of a make rule as ``-M`` writes it (continuation lines, escaped spaces),
    the target left out."""
    joined = _CONTINUATION.sub(" ", text)
    out: list[str] = []
    for rule in joined.splitlines():
        if ":" not in rule:
            continue
        rest = re.split(r"(?<!\\):(?:\s|$)", rule, maxsplit=1)
        if len(rest) < 2:
            continue
        for token in re.split(r"(?<!\\)\s+", rest[1].strip()):
            if token:
                out.append(token.replace("\\ ", " ").replace("\\#", "#").replace("$$", "$"))
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def outside(dependencies: Iterable[str], base: str, roots: Iterable[str]) -> list[str]:
    """The dependencies (relative ones taken from ``base``) whose real path (the file a compile
    reads, links resolved) lies under none of ``roots`` (each taken as written and resolved: a root
    may be a link, as /usr/local/cuda is)."""
    allowed = {os.path.normpath(r) for r in roots} | {os.path.realpath(r) for r in roots}
    return [dep for dep in dependencies
            if not any(_under(os.path.realpath(os.path.join(base, dep)), r) for r in allowed)]
