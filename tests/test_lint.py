"""The layering and the code's hygiene, checked in CI by the tools configured in pyproject.toml:
ruff (lint), mypy (types; the seams strictly), import-linter (only the UI imports Textual; the core
imports neither the UI nor the CLI; the evaluator and profiler do not import the search)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    exe = BIN / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (it is in the test extras: pip install -e '.[test]')")
    return found


def run(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff():
    r = run(tool("ruff"), "check", "forge_tui", "agent_tools", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts():
    r = run(tool("lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a hang guard: about 40 CPU-s from a cold cache, minutes of wall time on a loaded 2-core machine
def test_mypy():
    r = run(tool("mypy"), "--cache-dir", str(ROOT / ".mypy_cache"), timeout=1400)
    assert r.returncode == 0, r.stdout + r.stderr
