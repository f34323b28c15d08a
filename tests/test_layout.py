"""The codebase's shape, kept by tests: no module of the product over 800 lines, the product never
imports the bench scripts, and the tests import product code, never a bench script by path (a
smoke test may run one as a user does, in a process of its own)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 800
BENCH_SCRIPTS = {p.stem for p in (ROOT / "bench").rglob("*.py")}
"""The module names a bench script could be imported by (``e2e_bench``, ``codegen_bench``, ...)."""


def too_long(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every ``*.py`` under ``root`` longer than ``limit`` lines, with its length."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[str(path.relative_to(root))] = n
    return out


def bench_imports(path: Path) -> list[str]:
    """The imports in ``path`` of the ``bench`` folder or of a module named as a bench script is."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                if n.split(".")[0] == "bench" or n.split(".")[0] in BENCH_SCRIPTS]
    return out


LOADED_BY_PATH = re.compile(r"(spec_from_file_location|sys\.path\.(insert|append))\([^\n]*\bbench\b")
"""A bench script's module loaded by its path, or the bench folder put on the import path."""


def loads_bench_by_path(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for m in LOADED_BY_PATH.finditer(text)] + bench_imports(path)


def test_no_module_of_the_product_is_over_800_lines():
    assert too_long(ROOT / "forge_tui") == {}


def test_the_line_limit_finds_a_long_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 800)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 801)
    found = too_long(tmp_path, 800)
    assert list(found.values()) == [801] and next(iter(found)).endswith("long.py")


def test_the_product_never_imports_the_bench_scripts():
    found = [hit for path in sorted((ROOT / "forge_tui").rglob("*.py")) for hit in bench_imports(path)]
    assert found == []


def test_the_tests_never_load_a_bench_script_by_path():
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py")) if path.name != Path(__file__).name
             for hit in loads_bench_by_path(path)]
    assert found == []


def test_the_checks_find_each_way_of_reaching_a_bench_script(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    cases = {
        "by_spec.py": 'spec = importlib.util.spec_from_file_location("b", ROOT / "bench" / "e2e_bench.py")\n',
        "by_path.py": 'sys.path.insert(0, str(ROOT / "bench"))\n',
        "by_name.py": "import codegen_bench as cb\n",
        "by_package.py": "from bench.e2e_bench import targets\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert loads_bench_by_path(tmp_path / name), name
    # running a bench script as a user does is no import
    (tmp_path / "smoke.py").write_text('subprocess.run([sys.executable, str(ROOT / "bench" / "e2e_bench.py")])\n')
    assert loads_bench_by_path(tmp_path / "smoke.py") == []
