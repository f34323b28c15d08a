"""forge profile end to end: workspace creation, re-profiling, bad input, and the CLI's exit codes."""

import json
import subprocess
import sys

import pytest

from forge_tui.cli import main
from forge_tui.gitrepo import parse_trailers
from forge_tui.workspace import Workspace


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_profile_creates_git_workspace(fast_config, capsys, tmp_path):
    rc, out, err = run_cli(capsys, "profile", "example:tiny_mlp", "-w", "ws1", "-q")
    assert rc == 0, err
    assert "_softmax" in out and "native_layer_norm" in out and "headroom" in out
    ws = Workspace.open(tmp_path / "ws1")
    cards = ws.cards()
    assert len(cards) >= 6
    assert (ws.root / "optable.txt").read_text().count("\n") >= len(cards)
    rows = json.loads((ws.root / "optable.json").read_text())
    assert [r["card"] for r in rows] == [c.id for c in cards]  # sorted by share
    assert all(rows[i]["share"] >= rows[i + 1]["share"] for i in range(len(rows) - 1))
    with ws.git() as repo:
        (sha, message), = repo.log("main")
        assert parse_trailers(message)["Forge-Event"] == "profile"
        tracked = repo.git("ls-files").splitlines()
        assert "cards/" + cards[0].id + ".json" in tracked
        assert not any(p.startswith(".forge") for p in tracked)  # tensors stay out of git
        assert repo.git("status", "--porcelain") == ""
    # samples live in the cache, keyed by hash
    for card in cards:
        for s in card.samples:
            assert all(ws.store.has(k) for k in s.inputs + s.outputs)
    # the table can be printed again from the workspace alone
    rc, out, _ = run_cli(capsys, "cards", "ws1")
    assert rc == 0 and cards[0].id in out


def test_reprofile_existing_workspace(fast_config, capsys, tmp_path):
    assert run_cli(capsys, "profile", "example:kb_softmax", "-w", "ws", "-q")[0] == 0
    assert run_cli(capsys, "profile", "example:tiny_mlp", "-w", "ws", "-q")[0] == 0
    ws = Workspace.open(tmp_path / "ws")
    assert ws.meta["workload"]["name"] == "tiny_mlp"
    assert not any(c.target == "aten._softmax.default" and c.inputs[0].shape == [16, 512] for c in ws.cards())
    with ws.git() as repo:
        assert len(repo.log("main")) == 2
        assert repo.git("status", "--porcelain") == ""


def listing(path):
    return sorted(p.name for p in path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["profile", "missing.py", "-w", "ws"], "workload file not found: missing.py"),
    (["profile", "nomodel.py", "-w", "ws"], "defines no model"),
    (["profile", "raises.py", "-w", "ws"], "the model raised RuntimeError: kaboom"),
    (["profile", "example:tiny_mlp", "-w", "ws", "--dtype", "int3"], "unsupported dtype 'int3'"),
    (["profile", "example:tiny_mlp", "-w", "notours"], "exists and is not a forge workspace"),
    (["profile", "example:tiny_mlp", "-w", "afile"], "exists and is a file"),
])
def test_bad_input_one_line_nonzero_nothing_written(fast_config, capsys, tmp_path, argv, message):
    (tmp_path / "nomodel.py").write_text("x = 1\n")
    (tmp_path / "raises.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        raise RuntimeError('kaboom')\n"
        "def get_model():\n    return M()\ndef get_inputs():\n    return [torch.randn(3)]\n")
    (tmp_path / "notours").mkdir()
    (tmp_path / "notours" / "keep.txt").write_text("user data")
    (tmp_path / "afile").write_text("x")
    before = listing(tmp_path)
    rc, out, err = run_cli(capsys, *argv)
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forge: error: ") and message in lines[0], err
    assert listing(tmp_path) == before  # no workspace, no staging folder left behind
    assert (tmp_path / "notours" / "keep.txt").read_text() == "user data"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_cpu_machine(fast_config, capsys, tmp_path):
    rc, _, err = run_cli(capsys, "profile", "example:tiny_mlp", "-w", "ws", "--device", "cuda")
    assert rc == 2 and "no usable CUDA device" in err and not (tmp_path / "ws").exists()


def test_bad_config_is_named(fast_config, capsys, tmp_path):
    (tmp_path / "forge.toml").write_text("[timing]\nrepeatz = 3\n")
    rc, _, err = run_cli(capsys, "profile", "example:tiny_mlp", "-w", "ws")
    assert rc == 2 and "unknown key 'repeatz'" in err and not (tmp_path / "ws").exists()


def test_empty_folder_is_accepted(fast_config, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    rc, _, err = run_cli(capsys, "profile", "example:kb_softmax", "-w", "empty", "-q")
    assert rc == 0, err
    Workspace.open(tmp_path / "empty")


def test_console_scripts_installed(tmp_path):
    bindir = __import__("pathlib").Path(sys.executable).parent
    out = subprocess.run([str(bindir / "forge"), "examples"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "example:resnet50" in out.stdout
    out = subprocess.run([str(bindir / "forge"), "cards", str(tmp_path / "none")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no workspace at" in out.stderr


def test_core_does_not_import_textual():
    code = ("import sys, forge_tui.cli, forge_tui.profiler.run, forge_tui.workspace, forge_tui.program; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'textual'], 'textual imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
