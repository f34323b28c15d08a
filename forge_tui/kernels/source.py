"""Kernel files: CUDA (``.cu``, ``.cuh``) and C++ (``.h``, ``.cpp``) sources shipped beside the
modules that render them, read once and filled in with one substitution rule.

A file is plain source, or a template of named sections: a line ``//@section NAME`` opens
section NAME, which runs to the next such line (or the end of the file); the text before the
first marker is not part of any section. A section's text is its lines exactly as written, each
with its newline. Templates name their parameters ``$name`` or ``${name}`` (``string.Template``:
no expressions, no evaluation); ``fill`` substitutes every one of them and fails on a missing
value, naming it, so a template never renders with a parameter left out.
"""

from __future__ import annotations

import functools
import re
import string
from importlib import resources

SECTION_RE = re.compile(r"^//@section ([A-Za-z0-9_]+)\n", re.M)


@functools.cache
def read(package: str, name: str) -> str:
    """The text of kernel file ``name`` in ``package`` (a dotted package name)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


@functools.cache
def sections(package: str, name: str) -> dict[str, str]:
    """The sections of kernel file ``name`` in ``package``, by name."""
    text = read(package, name)
    marks = list(SECTION_RE.finditer(text))
    out: dict[str, str] = {}
    for k, mark in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        if mark.group(1) in out:
            raise ValueError(f"{package}/{name}: section {mark.group(1)} is defined twice")
        out[mark.group(1)] = text[mark.end():end]
    return out


def fill(template: str, **values: object) -> str:
    """``template`` with every ``$name`` replaced by ``str(values[name])``; a KeyError names any
    parameter without a value."""
    return string.Template(template).substitute({k: str(v) for k, v in values.items()})


class KernelFile:
    """One kernel file of a package: its whole text, its sections, and a section filled in."""

    def __init__(self, package: str, name: str) -> None:
        self.package, self.name = package, name

    @property
    def text(self) -> str:
        return read(self.package, self.name)

    def section(self, name: str) -> str:
        try:
            return sections(self.package, self.name)[name]
        except KeyError:
            raise KeyError(f"{self.package}/{self.name} has no section {name!r}") from None

    def fill(self, section: str, **values: object) -> str:
        """Section ``section`` with its parameters substituted (see ``fill``)."""
        return fill(self.section(section), **values)

    def inline(self, section: str, **values: object) -> str:
        """``fill`` without the newline that ends the section's last line: a fragment spliced into
        a line of another section (a typedef line, an argument list)."""
        return self.fill(section, **values).removesuffix("\n")
