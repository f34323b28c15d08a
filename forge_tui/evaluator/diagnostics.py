"""Compiler output (nvcc, ptxas, g++, ld) parsed into records; the raw text is kept beside them."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# file.cu(12): error: identifier "x" is undefined          (nvcc front end)
_NVCC = re.compile(r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\): (?P<sev>error|warning|remark|catastrophic error)"
                   r"(?: #\w+-\w+)?: (?P<msg>.*)$")
# file.cpp:12:5: error: 'x' was not declared in this scope  (gcc, clang, nvcc host pass)
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|note): (?P<msg>.*)$")
# ptxas error   : Entry function '_Z1kPf' uses too much shared data (0x10000 bytes, 0xc000 max)
_PTXAS = re.compile(r"^ptxas (?P<sev>error|warning|fatal)\s*: (?P<msg>.*)$")
# /usr/bin/ld: lib.o: undefined reference to `foo'
_LD = re.compile(r"^(?:/\S*/)?ld(?:\.\w+)?: (?P<msg>.*)$")
_PTXAS_FUNC = re.compile(r"ptxas info\s*: (?:Compiling entry function|Function properties for) '(?P<name>[^']+)'")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<rest>.*))?")
_SPILL = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int | None
    column: int | None
    severity: str  # "error", "warning", "note"
    message: str

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        return f"{where}: {self.severity}: {self.message}"


def _severity(text: str) -> str:
    text = text.lower()
    if "error" in text or text == "fatal":
        return "error"
    return "warning" if text == "warning" else "note"


def parse(text: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _NVCC.match(line)
        if m:
            out.append(Diagnostic(m["file"], int(m["line"]), None, _severity(m["sev"]), m["msg"].strip()))
            continue
        m = _GCC.match(line)
        if m:
            out.append(Diagnostic(m["file"], int(m["line"]), int(m["col"]) if m["col"] else None,
                                  _severity(m["sev"]), m["msg"].strip()))
            continue
        m = _PTXAS.match(line)
        if m:
            out.append(Diagnostic("ptxas", None, None, _severity(m["sev"]), m["msg"].strip()))
            continue
        m = _LD.match(line)
        if m and ("undefined reference" in m["msg"] or "error" in m["msg"]):
            out.append(Diagnostic("ld", None, None, "error", m["msg"].strip()))
    return out


def resources(text: str) -> dict[str, dict]:
    """Per-kernel registers, stack frame and spills from ``ptxas -v`` output."""
    res: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _PTXAS_FUNC.search(line)
        if m:
            current = m["name"]
            res.setdefault(current, {})
            continue
        if current is None:
            continue
        m = _SPILL.search(line)
        if m:
            res[current].update(stack_bytes=int(m["stack"]), spill_store_bytes=int(m["st"]), spill_load_bytes=int(m["ld"]))
        m = _PTXAS_USED.search(line)
        if m:
            res[current]["registers"] = int(m["regs"])
            rest = m["rest"] or ""
            smem = re.search(r"(\d+) bytes smem", rest)
            if smem:
                res[current]["shared_bytes"] = int(smem.group(1))
    return res
