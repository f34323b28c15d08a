"""Which proposer covers a card is worked out where the card is made and stored on it; the op table
only renders it (the import contract in pyproject.toml keeps ``forge_tui.table`` off the templates,
the search and the code generator), and a workspace whose cards predate the field works it out when
it loads them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forge_tui.cards import Card, Coverage, TensorSpec
from forge_tui.table import render, served_by
from forge_tui.workspace import Workspace, profile_into_workspace

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = '''
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cumsum(torch.softmax(x, -1), -1) + torch.tanh(x).sum(-1, keepdim=True)


def get_model():
    return Model()


def get_inputs():
    return [torch.randn(16, 64)]
'''


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("coverage")
    (root / "model.py").write_text(WORKLOAD)
    (root / "forge.toml").write_text("[timing]\nwarmup = 1\nrepeats = 2\nthreads = 1\n")
    ws, _ = profile_into_workspace(root / "model.py", root / "ws", device="cpu", config_path=root / "forge.toml")
    return ws


def _saved(ws: Workspace) -> dict[str, dict]:
    """The card files as the profile wrote them, by op name (the loader's own work left out)."""
    out = {}
    for path in sorted(ws.cards_dir.glob("*.json")):
        data = json.loads(path.read_text())
        out[Card.model_validate(data).op_name] = data
    return out


def test_a_profiled_card_carries_which_proposer_covers_it(profiled):
    saved = _saved(profiled)
    assert saved["_softmax"]["coverage"] == {"proposer": "template", "family": "softmax", "why_not": None}
    assert saved["tanh"]["coverage"] == {"proposer": "template", "family": "elementwise", "why_not": None}
    assert saved["sum"]["coverage"] == {"proposer": "generator", "family": "generated", "why_not": None}
    cumsum = saved["cumsum"]["coverage"]
    assert cumsum["proposer"] == "agent" and cumsum["family"] is None
    assert "cumsum" in cumsum["why_not"] and "left to the LLM agent" in cumsum["why_not"]


def test_the_op_table_renders_the_stored_coverage(profiled):
    text = (profiled.root / "optable.txt").read_text()
    ids = {c.op_name: c.id for c in profiled.cards()}
    line = {name: next(row for row in text.splitlines() if ids[name] in row) for name in ids}
    assert line["_softmax"].rstrip().endswith("softmax") and line["sum"].rstrip().endswith("generated")
    assert line["cumsum"].rstrip().endswith("-")


def _card(coverage: Coverage | None) -> Card:
    x = TensorSpec(shape=[16, 64], stride=[64, 1], dtype="float32", role="input")
    return Card(id="_softmax-0123456789", kind="op", target="aten._softmax.default", label="_softmax(16x64 fp32)",
                inputs=[x], outputs=[x.model_copy(update={"role": "output"})], program={}, calls=1, time_us=10.0,
                share=0.5, floor_us=1.0, headroom=10.0, coverage=coverage)


def test_the_table_renders_coverage_without_importing_the_templates():
    """In a fresh process: the table renders a card's family from the card alone, and neither the
    templates, the search nor the code generator is imported for it."""
    code = textwrap.dedent('''
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_table_coverage import Coverage, _card
        from forge_tui.table import render
        print(render([_card(Coverage(proposer="template", family="softmax"))]))
        print("loaded:", sorted(m for m in sys.modules if m.split(".")[:2] in
                                (["forge_tui", "templates"], ["forge_tui", "search"], ["forge_tui", "codegen"])))
    ''')
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "_softmax-0123456789" in line)
    assert row.rstrip().endswith("softmax")
    assert "loaded: []" in r.stdout


def test_a_card_without_coverage_still_renders():
    text = render([_card(None)], title="t")
    row = next(line for line in text.splitlines() if "_softmax-0123456789" in line)
    assert row.rstrip().endswith("-") and "offline kernels" not in text
    assert served_by([_card(None)]) == {}
    agent = Coverage(proposer="agent", why_not="no template family serves it")
    assert served_by([_card(agent)]) == {}
    assert served_by([_card(Coverage(proposer="template", family="softmax"))]) == {"_softmax-0123456789": "softmax"}


def test_an_old_workspace_gets_coverage_when_it_loads_its_cards(profiled):
    """A workspace whose card files predate the field: the loader works the fact out (in memory,
    the files untouched) and the table shows the same kernels as for a fresh profile."""
    fresh = {c.id: c.coverage for c in profiled.cards()}
    before = render(profiled.cards())
    for path in profiled.cards_dir.glob("*.json"):
        data = json.loads(path.read_text())
        del data["coverage"]
        path.write_text(json.dumps(data, indent=1) + "\n")
    try:
        old = Workspace(profiled.root)
        assert {c.id: c.coverage for c in old.cards()} == fresh
        some = next(iter(fresh))
        assert old.card(some).coverage == fresh[some]
        assert render(old.cards()) == before
        assert all("coverage" not in json.loads(p.read_text()) for p in profiled.cards_dir.glob("*.json"))
    finally:
        subprocess.run(["git", "checkout", "--", "cards"], cwd=profiled.root, check=True, capture_output=True)
