"""Kernels from a description and forge_tui.generate, on the CPU without a network: a scripted
conversation that writes a reference through the real loop and the real sandbox, `forge new`
through the CLI against a local fake Anthropic server, the sandbox's refusals, and generate() from
a Python function with the template proposer."""

from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm import FakeLLM, anthropic_message

from agent_tools.reference import run_reference
from forge_tui.agent.messages import AssistantMessage, ModelTurn, ToolCall, Usage
from forge_tui.agent.providers import ScriptedProvider
from forge_tui.agent.transcript import read_entries
from forge_tui.cli import main
from forge_tui.config import parse_config
from forge_tui.errors import ForgeError

DESCRIPTION = "LayerNorm + GELU over (64, 256) fp32"
BROKEN = '''import torch
import torch.nn.functional as F


def reference(x, weight, bias):
    return F.gleu(F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5))


def example_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    weight = 1.0 + 0.1 * torch.randn(256, generator=g)
    bias = 0.1 * torch.randn(256, generator=g)
    return [t.to(device) for t in (x, weight, bias)]
'''
FIXED = BROKEN.replace("F.gleu(", "F.gelu(")
SUMMARY = "gelu(layer_norm(x) * weight + bias) over the last dim; x (64, 256) fp32, weight and bias (256,) fp32"
AGENT = {"provider": "anthropic", "model": "claude-sonnet-4-6", "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}
SECRET = "sk-ant-" + "s3cret" * 8


def turn(*calls: tuple[str, dict], text: str = "") -> ModelTurn:
    tcs = [ToolCall(id=f"call_{i}_{name}", name=name, arguments=args) for i, (name, args) in enumerate(calls)]
    return ModelTurn(message=AssistantMessage(text=text, tool_calls=tcs), stop_reason="tool_use",
                     usage=Usage(input_tokens=2000, output_tokens=300), model="scripted")


def results(provider: ScriptedProvider) -> list:
    """Every tool result the model was sent, in order."""
    last = provider.calls[-1].messages
    return [r for m in last if m.role == "tool" for r in m.results]


# ---- the conversation ------------------------------------------------------------------------------

def test_a_scripted_conversation_writes_fixes_and_submits_a_reference(tmp_path, monkeypatch):
    from forge_tui.describe import draft_reference

    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)  # the sandbox's child must not see it
    printing = FIXED.replace("def reference(x, weight, bias):\n",
                             "def reference(x, weight, bias):\n    import os\n    print(sorted(os.environ.items()))\n")
    broken = BROKEN.replace("def reference(x, weight, bias):\n",
                            "def reference(x, weight, bias):\n    import os\n    print(sorted(os.environ.items()))\n")
    prov = ScriptedProvider([
        turn(("write_file", {"path": "reference.py", "content": broken}), ("try_reference", {}),
             text=f"Writing it. (my key is {SECRET})"),
        turn(("submit", {"summary": SUMMARY})),  # too early: the last try failed
        turn(("edit_file", {"path": "reference.py", "old": "F.gleu(", "new": "F.gelu("}), ("try_reference", {})),
        turn(("submit", {"summary": SUMMARY})),
    ])
    cfg = parse_config({"agent": AGENT})
    steps: list[dict] = []
    draft = draft_reference(DESCRIPTION, cfg, provider=prov, workdir=tmp_path / "conv", on_step=steps.append)

    assert draft.ok and draft.submitted and draft.source == printing and draft.summary == SUMMARY
    assert draft.name == "LayerNormGELU"
    rep = draft.report
    assert rep is not None and rep.ok and rep.confined and rep.deterministic and rep.seeded
    assert [(d["shape"], d["dtype"]) for d in rep.inputs] == [([64, 256], "float32"), ([256], "float32"),
                                                               ([256], "float32")]
    assert [(d["shape"], d["dtype"], d["stride"]) for d in rep.outputs] == [([64, 256], "float32", [256, 1])]

    # what the model was told and given
    first = prov.calls[0]
    assert "`reference.py` defines two functions" in first.system and "Limits: 40 tool calls" in first.system
    assert DESCRIPTION in first.messages[0].text
    assert {t.name for t in first.tools} == {"read_file", "write_file", "edit_file", "list_files", "try_reference",
                                              "submit"}
    # what it was answered: the traceback, the refused submission, the report of the fixed file
    wrote, tried_broken, early_submit, edited, tried_fixed = results(prov)
    assert not wrote.is_error and wrote.content.startswith("wrote reference.py")
    assert "FAILED in reference(*inputs)" in tried_broken.content and "has no attribute 'gleu'" in tried_broken.content
    assert early_submit.is_error and "the last try_reference of reference.py failed" in early_submit.content
    assert not edited.is_error
    assert tried_fixed.content.startswith("try_reference reference.py: OK") and "float32 shape (64, 256)" in tried_fixed.content
    # the child ran with a scrubbed environment: its printed environment holds no key
    assert "'HOME'" in tried_fixed.content and "ANTHROPIC_API_KEY" not in tried_fixed.content
    assert all(SECRET not in r.content for r in results(prov))

    # the transcript is on disk, every step, every cost, and no secret
    entries = read_entries(tmp_path / "conv" / "transcript.jsonl")
    assert entries[0]["type"] == "start" and entries[0]["description"] == DESCRIPTION
    assert entries[-1]["type"] == "end" and entries[-1]["submitted"]
    assert sum(e["cost_usd"] for e in entries if e["type"] == "query") == pytest.approx(4 * (2000 * 3 + 300 * 15) / 1e6)
    assert draft.cost_usd == pytest.approx(4 * (2000 * 3 + 300 * 15) / 1e6) and len(steps) == 4
    assert SECRET not in (tmp_path / "conv" / "transcript.jsonl").read_text()
    assert "[redacted]" in (tmp_path / "conv" / "transcript.jsonl").read_text()
    # the tools saw only the conversation's folder: the transcript is beside it, out of reach
    assert sorted(p.name for p in (tmp_path / "conv" / "work").iterdir()) == ["reference.py"]


def test_the_run_money_cap_holds_for_the_conversation(tmp_path):
    from forge_tui.describe import draft_reference

    prov = ScriptedProvider([turn(("list_files", {}))] * 3)
    cfg = parse_config({"agent": AGENT, "search": {"max_cost_usd": 0.001}})
    draft = draft_reference(DESCRIPTION, cfg, provider=prov, workdir=tmp_path / "conv")
    assert prov.calls == [] and not draft.ok and "run's money cap" in draft.why_not


# ---- the sandbox -------------------------------------------------------------------------------------

ESCAPES = {
    "socket": "import socket\n    socket.create_connection(('127.0.0.1', 9))",
    "write": "open({outside!r}, 'w').write('escaped')",
    "fork": "import os\n    os.fork()",
    "subprocess": "import subprocess\n    subprocess.run(['touch', {outside!r}])",
}


@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_try_reference_refuses_escapes_inside_the_child(tmp_path, how):
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "escaped.txt"
    body = ESCAPES[how].format(outside=str(outside))
    (work / "reference.py").write_text(f"import torch\n\n\ndef reference(x):\n    {body}\n    return x * 2\n\n\n"
                                       "def example_inputs(device='cpu'):\n    return [torch.ones(4, device=device)]\n")
    rep = run_reference(work, wall_s=60)
    assert not rep.ok and rep.stage == "call" and rep.refused and rep.confined
    assert "PermissionError: [Errno 1] Operation not permitted" in rep.error
    assert "the sandbox refused a system call" in rep.text()
    assert not outside.exists() and sorted(p.name for p in work.iterdir()) == ["reference.py"]


def test_try_reference_stops_an_endless_reference(tmp_path):
    (tmp_path / "reference.py").write_text("import torch\n\n\ndef reference(x):\n    while True:\n        pass\n\n\n"
                                           "def example_inputs(device='cpu'):\n    return [torch.ones(4)]\n")
    rep = run_reference(tmp_path, wall_s=6)
    assert not rep.ok and rep.stage == "timeout" and 6 <= rep.wall_s < 12
    assert "ran past the 6 s wall-time limit" in rep.text()
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftover == ""


# ---- forge new -----------------------------------------------------------------------------------------

def conversation(fake: FakeLLM) -> None:
    fake.reply(anthropic_message("Writing the reference.", [("toolu_1", "write_file", {"path": "reference.py",
                                                                                           "content": FIXED}),
                                                            ("toolu_2", "try_reference", {})]),
               anthropic_message("", [("toolu_3", "submit", {"summary": SUMMARY})]))


@pytest.fixture
def agent_config(fast_config, monkeypatch):
    """./forge.toml with fast timing and the agent on a local fake Anthropic server."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM() as fake:
        fast_config.write_text(fast_config.read_text() + f'\n[agent]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"'
                               f'\nbase_url = "{fake.base_url}"\nretries = 0\n')
        yield fake


def _left_behind(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name not in ("forge.toml",))


def test_forge_new_yes_makes_a_workspace_with_the_module_card(agent_config, tmp_path, capsys):
    from forge_tui.workspace import Workspace

    conversation(agent_config)
    ws_path = tmp_path / "ws"
    assert main(["new", DESCRIPTION, "-w", str(ws_path), "--yes", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert FIXED.strip() in out and "try_reference reference.py: OK" in out and "float32 shape (64, 256)" in out
    assert f"next: forge search {ws_path}" in out
    ws = Workspace.open(ws_path)
    (card,) = ws.cards()
    # the wrapper is one module card, and its program is the reference's aten program
    assert card.kind == "module" and card.target == "module:LayerNormGELU" and card.module_paths == [""]
    assert [n["op"] for n in card.program["nodes"]] == ["aten.native_layer_norm.default", "aten.gelu.default"]
    assert [(s.shape, s.dtype, s.role) for s in card.inputs] == [([64, 256], "float32", "input"),
                                                                  ([256], "float32", "input"), ([256], "float32", "input")]
    assert [s.shape for s in card.outputs] == [[64, 256]] and card.samples and card.time_us
    # the reference, its wrapper and the conversation are committed on main, nothing left out
    tracked = subprocess.run(["git", "-C", str(ws_path), "ls-files"], capture_output=True, text=True).stdout.split()
    assert {"reference.py", "workload.py", "draft/transcript.jsonl", "draft/draft.json"} <= set(tracked)
    assert (ws_path / "reference.py").read_text() == FIXED
    assert subprocess.run(["git", "-C", str(ws_path), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""
    record = json.loads((ws_path / "draft" / "draft.json").read_text())
    assert record["description"] == DESCRIPTION and record["card"] == card.id and record["summary"] == SUMMARY
    assert record["approved_by"] == "forge new --yes" and record["queries"] == 2
    assert SECRET not in (ws_path / "draft" / "transcript.jsonl").read_text()
    # the workspace's workload is the wrapper, loadable on its own (forge bench, a re-profile)
    code = ("from forge_tui.workload import load_workload; import sys; m, i = load_workload(sys.argv[1]).build('cpu'); "
            "print(type(m).__name__, [tuple(t.shape) for t in i])")
    loaded = subprocess.run([sys.executable, "-c", code, str(ws_path / "workload.py")], capture_output=True, text=True)
    assert loaded.stdout.strip() == "LayerNormGELU [(64, 256), (256,), (256,)]", loaded.stderr
    assert len(agent_config.requests) == 2 and agent_config.requests[0].headers["authorization"] == f"Bearer {SECRET}"


def test_forge_new_refused_or_without_a_terminal_leaves_nothing(agent_config, tmp_path, capsys, monkeypatch):
    ws_path = tmp_path / "ws"
    # no terminal and no --yes: refused before any query
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["new", DESCRIPTION, "-w", str(ws_path)]) == 2
    err = capsys.readouterr().err
    assert "pass --yes" in err and len(err.strip().splitlines()) == 1
    assert agent_config.requests == [] and _left_behind(tmp_path) == []

    # on a terminal, answered "n"
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    asked: list[str] = []
    monkeypatch.setattr(sys, "stdin", Terminal(""))
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "n")
    conversation(agent_config)
    assert main(["new", DESCRIPTION, "-w", str(ws_path)]) == 1
    out = capsys.readouterr().out
    assert asked == ["Use this as the card? [y/N] "] and "no workspace was made" in out
    assert len(agent_config.requests) == 2 and _left_behind(tmp_path) == []


def test_forge_new_without_an_agent_says_why_in_one_line(fast_config, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["new", DESCRIPTION, "-w", str(tmp_path / "ws"), "--yes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the LLM agent" in err[0] and "no LLM API key in the environment" in err[0]
    assert _left_behind(tmp_path) == []


# ---- forge_tui.generate ----------------------------------------------------------------------------------

def layer_norm(x, weight, bias):
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


def test_generate_from_a_function_serves_its_inputs_and_falls_back_for_others(fast_config, tmp_path):
    import torch

    import forge_tui
    from forge_tui.promotion import AutoRule, manifest

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 256, generator=g), torch.randn(256, generator=g), torch.randn(256, generator=g)
    # any passing kernel is promoted and used, however it timed (this machine's timing is not the test)
    op = forge_tui.generate(layer_norm, [x, w, b], workspace=tmp_path / "ws", proposer="templates", max_evals=2,
                            rule=AutoRule(min_speedup=0.0, max_spread=100.0), only_faster=False)
    assert isinstance(op, forge_tui.GeneratedOp)
    # F.layer_norm returns native_layer_norm's first output: its card is the op card the templates serve
    assert op.card.target == "aten.native_layer_norm.default" and op.search is not None
    assert op.kernel is not None and manifest(op.workspace).entries[op.card.id].evidence.node == op.kernel
    torch.testing.assert_close(op(x, w, b), layer_norm(x, w, b))
    st = op.status()
    assert st["active"] and st["calls"] == 1 and st["served"] == 1 and st["fallbacks"] == {}
    # another shape, another dtype: the reference runs, and the status says why
    x2 = torch.randn(8, 256)
    torch.testing.assert_close(op(x2, w, b), layer_norm(x2, w, b))
    op(x.double(), w.double(), b.double())
    st = op.status()
    assert st["calls"] == 3 and st["served"] == 1
    assert st["fallbacks"] == {"input 0: shape (8, 256)": 1, "input 0: dtype float64": 1}
    assert f"kernel {op.kernel} of {op.card.id}" in repr(op) and "1 by the kernel" in repr(op)

    # a second function in the same workspace, no search: its card is added, and the op still works
    def scaled_softmax(x):
        return torch.softmax(x * 0.5, dim=-1)

    op2 = forge_tui.generate(scaled_softmax, [x], workspace=tmp_path / "ws", max_evals=0)
    assert op2.kernel is None and "max_evals=0" in op2.status()["why_not"]
    torch.testing.assert_close(op2(x), scaled_softmax(x))
    assert op2.status()["fallbacks"] == {"no kernel": 1} and "no kernel" in repr(op2)
    assert {c.id for c in op2.workspace.cards()} == {op.card.id, op2.card.id}
    assert (tmp_path / "ws" / "references" / op2.card.id / "workload.py").is_file()

    # the same function again: the workspace's card and kernel are reused, no search
    op3 = forge_tui.generate(layer_norm, [x, w, b], workspace=tmp_path / "ws", proposer="templates",
                             only_faster=False)
    assert op3.search is None and op3.kernel == op.kernel
    op3(x, w, b)
    assert op3.status()["served"] == 1


def test_generate_from_a_description_drafts_the_reference_with_the_agent(fast_config, tmp_path):
    import torch

    import forge_tui

    fast_config.write_text(fast_config.read_text() + '\n[agent]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n')
    prov = ScriptedProvider([turn(("write_file", {"path": "reference.py", "content": FIXED}), ("try_reference", {})),
                             turn(("submit", {"summary": SUMMARY}))])
    op = forge_tui.generate(DESCRIPTION, yes=True, provider=prov, workspace=tmp_path / "ws", max_evals=0)
    assert len(prov.calls) == 2 and op.card.target == "module:LayerNormGELU" and op.kernel is None
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 256, generator=g), torch.randn(256, generator=g), torch.randn(256, generator=g)
    expected = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (256,), w, b, eps=1e-5))
    torch.testing.assert_close(op(x, w, b), expected)
    assert op.status()["fallbacks"] == {"no kernel": 1}
    record = json.loads((tmp_path / "ws" / "draft" / "draft.json").read_text())
    assert record["approved_by"] == "forge_tui.generate(yes=True)" and record["card"] == op.card.id


def test_generate_from_a_description_needs_yes_and_an_agent(tmp_path, monkeypatch):
    import forge_tui

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ForgeError, match="pass yes=True"):
        forge_tui.generate(DESCRIPTION)
    with pytest.raises(ForgeError, match="needs the LLM agent.*no LLM API key in the environment"):
        forge_tui.generate(DESCRIPTION, yes=True)
    with pytest.raises(ForgeError, match="example inputs are needed"):
        forge_tui.generate(layer_norm)
    assert list(tmp_path.iterdir()) == []


def test_importing_forge_tui_stays_cheap():
    code = "import sys, forge_tui; forge_tui.generate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
