"""Comments and docstrings explain the code, never its history: no dates, no session or run counts,
no GPU named beside a measured figure, no reference to the removed ``bench/lab`` probes. Figures
that justify a design belong in docs/ (benchmarks.md and the topic pages) and in commit messages.

Comments are read with ``tokenize`` (consecutive comment lines as one block, so a figure a line
away from the GPU it was measured on is still seen), docstrings (and attribute docstrings) with
``ast``."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("forge_tui", "agent_tools")

GPU = r"(?<![\w/])(?:H100|H200|H20|GH200|GB200|B100|B200|A100|A10G?|A30|A40|L4|L40S?|V100|T4|RTX ?\d{4})(?![\w-])"
FIGURE = r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:\s?(?:x|µs|us|ms|s|%|GB/s|TB/s|GiB|GB|MB|SMs))?(?![\w.])"
"""A figure: a number standing alone (not part of a name such as sm_90 or fp16), with or without
its unit."""
WINDOW = 120
"""Characters either side of a GPU's name searched for a figure: about a sentence."""

PATTERNS: dict[str, re.Pattern[str]] = {
    "a date": re.compile(r"(?<![\w-])20\d{2}-\d{2}-\d{2}(?![\w-])"),
    "bench/lab": re.compile(r"bench/lab\b"),
    "run data in docs/runs": re.compile(r"docs/runs\b"),
    "a session or run count": re.compile(
        r"\b(?:session|call|run|attempt)s? \d+\b(?! (?:bytes|calls|elements|threads|rows|times))"
        r"|\b\d+ of \d+ (?:runs|sessions|calls|attempts)\b"
        r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)) session\b"
        r"|\b\d+ since then\b",
        re.IGNORECASE),
    "an unexplained finding": re.compile(r"\bcause (?:is|was) (?:still )?not (?:yet )?found\b", re.IGNORECASE),
}
GPU_NAME = re.compile(GPU)
FIGURE_RE = re.compile(FIGURE)


def texts(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment block and every docstring of ``source``."""
    out: list[tuple[int, str]] = []
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line == last + 1:
            block.append(tok.string.lstrip("#").strip())
        else:
            if block:
                out.append((start, "\n".join(block)))
            block, start = [tok.string.lstrip("#").strip()], line
        last = line
    if block:
        out.append((start, "\n".join(block)))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    return out


def history(text: str) -> list[tuple[int, str]]:
    """(line offset within ``text``, what) of each piece of history in one comment or docstring."""
    found = [(text[:m.start()].count("\n"), f"{what}: {m.group(0)!r}")
             for what, pattern in PATTERNS.items() for m in pattern.finditer(text)]
    for m in GPU_NAME.finditer(text):
        lo = max(0, m.start() - WINDOW)
        figures = list(FIGURE_RE.finditer(text[lo:m.end() + WINDOW]))
        if figures:
            nearest = min(figures, key=lambda f: min(abs(lo + f.start() - m.end()), abs(lo + f.end() - m.start())))
            found.append((text[:m.start()].count("\n"),
                          f"a GPU named beside a measured figure: {m.group(0)!r} near {nearest.group(0)!r}"))
    return found


def findings(path: Path) -> list[str]:
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{rel}:{line + offset}: {what}"
            for line, text in texts(path.read_text(encoding="utf-8"))
            for offset, what in history(text)]


def test_no_history_in_comments_or_docstrings():
    found = [f for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py")) for f in findings(path)]
    assert not found, ("comments and docstrings say what the code does and why, not what was measured when "
                       "(figures go to docs/):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "the bench measured it (2026-12-04, second session, call 2)",
    "on the H200 it ran 1.2x",
    "635-862 µs more (2 since then)",
    "timed on an H100: no faster, bench/lab/row_configs.py",
    "faster in 3 of 6 runs",
    "it ran slower in the same process; the cause is not found",
    "the ninth session's timeline",
    "docs/runs/issue-15-17-h200.md has the log",
    "one block a row used 32 of the H200's\n132 SMs",
    "a ResNet-50 forward ran 1.51x faster in eager\non the H200",
    "the decoder's rotary chain, on the H100, missed eager by 8",
])
def test_history_is_found(text):
    assert history(text), text


@pytest.mark.parametrize("text", [
    "sm_90 (Hopper) when there is none",
    'a dated snapshot ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06")',
    "``µs/call``: the card's time a call, in µs",
    "the judge leads a session of its own",
    "transformers 5.2x renames the forward's argument",
    "a kernel 10x faster than eager would be timed in samples a tenth as long",
    "the first call's variant, or one that serves where the direct call's does not",
    "Calls of a module card's original forward timed (at most 64 calls)",
])
def test_explanations_pass(text):
    assert not history(text), history(text)


def test_findings_name_file_and_line(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text('"""A module."""\n\nX = 1\n# fine\n# measured 2026-12-04 on the H200: 1.2x\n\n\n'
                   'def f():\n    """What f does.\n\n    It ran 3 of 6 runs faster."""\n')
    assert findings(src) == [
        f"{src}:5: a date: '2026-12-04'",
        f"{src}:5: a GPU named beside a measured figure: 'H200' near '1.2x'",
        f"{src}:11: a session or run count: '3 of 6 runs'",
    ]
