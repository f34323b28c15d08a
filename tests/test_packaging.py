"""The distribution: the prompts ship as data of ``forge_tui``, and no top-level ``prompts`` package
is installed; a source checkout (and an editable install) reads the repository's ``prompts/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from forge_tui.agent import context
from forge_tui.errors import ForgeError

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = sorted(p.relative_to(ROOT / "prompts").as_posix() for p in (ROOT / "prompts").rglob("*") if p.is_file()
                 and "__pycache__" not in p.parts)
SOURCES = ("pyproject.toml", "setup.py", "README.md", "forge_tui", "agent_tools", "prompts")
"""What a build reads (copied, so that the build writes nothing into the checkout)."""


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    for name in SOURCES:
        if not (ROOT / name).exists():
            continue  # what the build then makes is checked by the test
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp / "dist").glob("forge_tui-*.whl")
    return wheel


def test_the_checkout_has_every_prompt_and_no_prompts_package():
    assert {"system.md", "task.md", "rules.md", "new_system.md", "new_task.md", "notes/cuda.md"} <= set(PROMPTS)
    assert "__init__.py" not in PROMPTS
    assert context.prompts_dir() == context.CHECKOUT_PROMPTS == ROOT / "prompts"
    for name in PROMPTS:
        assert context.prompt_text(name) == (ROOT / "prompts" / name).read_text()


def test_missing_prompts_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(context, "CHECKOUT_PROMPTS", tmp_path / "prompts")
    context.prompts_dir.cache_clear()
    try:
        with pytest.raises(ForgeError, match=r"prompt templates are missing: .* holds system.md \(reinstall forge-tui\)"):
            context.prompt_text("system.md")
    finally:
        context.prompts_dir.cache_clear()


@pytest.mark.slow
def test_the_wheel_ships_the_prompts_as_forge_tui_data(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert sorted(zf.read(top_level).decode().split()) == ["agent_tools", "forge_tui"]
        zf.extractall(tmp_path / "installed")
    assert not [n for n in names if n.startswith("prompts/")]
    assert sorted(n.removeprefix("forge_tui/prompts/") for n in names if n.startswith("forge_tui/prompts/")) == PROMPTS
    # the installed files, imported from elsewhere than the checkout: every prompt found, no `prompts`
    code = """if True:
        import importlib.util, json, sys
        from forge_tui.agent import context
        names = json.loads(sys.argv[1])
        print(json.dumps({"module": context.__file__, "dir": str(context.prompts_dir()),
                          "texts": {n: context.prompt_text(n) for n in names},
                          "prompts": importlib.util.find_spec("prompts") is not None}))
    """
    site = tmp_path / "installed"
    out = subprocess.run([sys.executable, "-c", code, json.dumps(PROMPTS)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["module"] == str(site / "forge_tui" / "agent" / "context.py")
    assert got["dir"] == str(site / "forge_tui" / "prompts")
    assert got["texts"] == {n: (ROOT / "prompts" / n).read_text() for n in PROMPTS}
    assert got["prompts"] is False
