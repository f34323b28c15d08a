"""The README and the pages under docs/: the quick start is what CI runs, the README stays a
newcomer's page, and every relative link in them leads somewhere."""

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 150



def test_ci_runs_the_readme_test_command():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    readme = (ROOT / "README.md").read_text()
    assert len(ci) == 1 and ci[0] in readme
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in quick.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and commands[1] == ci[0]


def readme_too_long(text: str) -> str | None:
    n = len(text.splitlines())
    return f"README.md has {n} lines, more than {README_MAX_LINES}: move the detail to a page under docs/" \
        if n > README_MAX_LINES else None


def test_readme_is_at_most_150_lines():
    assert readme_too_long((ROOT / "README.md").read_text()) is None
    assert readme_too_long("line\n" * README_MAX_LINES) is None
    assert "151 lines" in (readme_too_long("line\n" * (README_MAX_LINES + 1)) or "")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(text: str) -> list[str]:
    """Every link and image target in a Markdown text (not what code spans or blocks hold)."""
    found = []
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs["href"]))
            elif child.type == "image":
                found.append(str(child.attrs["src"]))
    return found


def anchors(page: Path) -> set[str]:
    tokens = MarkdownIt("commonmark").parse(page.read_text())
    return {slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a page that lead to no file, or to no heading of the file they name."""
    broken = []
    for href in links(page.read_text()):
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or href.startswith("mailto:"):
            continue
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        name = target.relative_to(root).as_posix() if target.is_relative_to(root) else str(target)
        if not target.exists():
            broken.append(f"{href} (no file {name})")
        elif parts.fragment and target.suffix == ".md" and unquote(parts.fragment) not in anchors(target):
            broken.append(f"{href} (no heading #{parts.fragment} in {name})")
    return broken


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_in_the_docs_resolves():
    assert len(pages()) > 1
    broken = {p.relative_to(ROOT).as_posix(): b for p in pages() if (b := broken_links(p))}
    assert not broken, broken


def test_the_link_check_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#its-part) [ok](#top) [web](https://example.com/x.md)\n\n# Top\n\n"
        "`[code](docs/none.md)`\n\n```\n[block](docs/none.md)\n```\n\n"
        "| a | [cell](docs/gone.md) |\n|---|---|\n\n"
        "[bad](docs/b.md) [bad](docs/a.md#nowhere) ![img](docs/pic.png)\n")
    assert broken_links(page, tmp_path) == ["docs/gone.md (no file docs/gone.md)", "docs/b.md (no file docs/b.md)",
                                  "docs/a.md#nowhere (no heading #nowhere in docs/a.md)",
                                  "docs/pic.png (no file docs/pic.png)"]
