from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    readme = (ROOT / "README.md").read_text()
    assert len(ci) == 1 and ci[0] in readme
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in quick.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and commands[1] == ci[0]
