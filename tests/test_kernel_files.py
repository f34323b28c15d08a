"""Kernel files (forge_tui/kernels/source.py): sections and their one substitution rule, and every
kernel file shipped in the package."""

import tomllib
from pathlib import Path

import pytest

from forge_tui.kernels import source
from forge_tui.kernels.source import KernelFile, fill

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SUFFIXES = (".cu", ".cuh", ".h", ".cpp", ".c")


def test_fill_substitutes_every_parameter_and_names_a_missing_one():
    assert fill("f<${t}, $n>(x);\n", t="float", n=4) == "f<float, 4>(x);\n"
    with pytest.raises(KeyError, match="vec"):
        fill("load<$vec>(p);", threads=128)


def test_fill_evaluates_nothing():
    """A value is text: no expression in a template or in a value is evaluated."""
    assert fill("${a}", a="${b}") == "${b}"
    with pytest.raises(ValueError):
        fill("${a + 1}", a=1)


def test_sections_are_the_lines_between_markers(tmp_path, monkeypatch):
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.cu").write_text("/* about the file */\n\n//@section one\n\nint a;\n//@section two\nint b = $v;\n")
    (pkg / "twice.cu").write_text("//@section one\nx\n//@section one\ny\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    k = KernelFile("kpkg", "k.cu")
    assert k.section("one") == "\nint a;\n"  # its lines exactly, the blank first one included
    assert k.fill("two", v=3) == "int b = 3;\n"
    assert k.inline("two", v=3) == "int b = 3;"
    with pytest.raises(KeyError, match="three"):
        k.section("three")
    with pytest.raises(ValueError, match="twice"):
        source.sections("kpkg", "twice.cu")


def test_every_kernel_file_ships_in_the_package():
    """Each .cu/.cuh/.h/.cpp/.c file under forge_tui/ matches a package-data pattern, so a wheel
    (not only an editable install) has the sources the families and the generator read."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["forge_tui"]
    pkg = ROOT / "forge_tui"
    shipped = {p for pat in patterns for p in pkg.glob(pat)}
    files = {p for p in pkg.rglob("*") if p.suffix in KERNEL_SUFFIXES and "__pycache__" not in p.parts}
    assert files, "no kernel files found"
    assert files <= shipped, sorted(str(p.relative_to(pkg)) for p in files - shipped)


def test_every_section_a_module_reads_exists():
    """The families and the generator read their sections at render time: each file they name
    exists and parses, and each section they ask for is in it."""
    import re

    from forge_tui.kernels import common  # noqa: F401 - reads its files on import

    pkg = ROOT / "forge_tui"
    used = 0
    for py in pkg.rglob("*.py"):
        text = py.read_text()
        files = dict(re.findall(r'^(\w+) = KernelFile\(__package__, "([\w.]+)"\)', text, re.M))
        for var, name in files.items():
            package = ".".join(py.relative_to(ROOT).with_suffix("").parts[:-1])
            names = set(source.sections(package, name))
            for sec in re.findall(rf'\b{var}\.(?:section|fill|inline)\("(\w+)"[,)]', text):
                assert sec in names, (py.name, name, sec)
                used += 1
    assert used > 50
