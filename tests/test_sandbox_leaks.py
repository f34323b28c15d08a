"""Nothing leaves the sandbox (issue 55, items 1-4), driven as an attacker would: the real anthropic
and openai SDK clients against the local fake server (``fake_llm.py``), whose scripted model calls
the tools with hostile arguments, while the environment holds a fake API key and a token.

1. a compile of a source that includes a file outside (directly, through a macro, or
   /proc/self/environ) never shows the model that file's text;
2. a draft replaced by a link to a file outside is refused, never read, never committed;
3. the reference run (try_reference, and the accept step of ``forge new --yes``) cannot read an
   outside file, /etc/passwd or its parent's /proc/PID/environ;
4. no tool result holds a secret of the environment, and no commit either.

Then the pieces on their own: the include checker, the no-follow reader, the redaction and the git
wrapper's refusal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FAST_TOML, ROOT
from fake_llm import FakeLLM, anthropic_message, openai_completion

from agent_tools import ToolEnv, kernel_tools, run_tool
from forge_tui.agent.loop import Agent, Limits
from forge_tui.agent.pricing import Price
from forge_tui.agent.providers import AnthropicProvider, OpenAIProvider
from forge_tui.agent.transcript import Transcript
from forge_tui.evaluator.result import BuildReport
from forge_tui.search.ledger import Ledger

KEY = "sk-ant-test-" + "Q7" * 20
TOKEN = "tok-" + "z9" * 12
"""A token whose value has no known shape: only its variable's name (SOME_TOKEN) makes it a secret."""
PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
KINDS = ["anthropic", "openai"]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


@pytest.fixture
def secrets_env(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY.replace("-ant", ""))
    monkeypatch.setenv("SOME_TOKEN", TOKEN)


def provider(kind: str, fake: FakeLLM):
    if kind == "anthropic":
        return AnthropicProvider("claude-test", os.environ["ANTHROPIC_API_KEY"], base_url=fake.base_url, retries=0)
    return OpenAIProvider("gpt-test", os.environ["OPENAI_API_KEY"], base_url=fake.openai_base_url, retries=0)


def turn(kind: str, *calls: tuple[str, dict], before=None):
    """One scripted reply of the model calling ``calls`` (name, arguments), in the wire format of ``kind``."""
    named = [(f"call_{i}_{name}", name, args) for i, (name, args) in enumerate(calls)]
    reply = anthropic_message("", named) if kind == "anthropic" else openai_completion(None, named)
    reply.before = before
    return reply


def results_sent(kind: str, fake: FakeLLM) -> list[str]:
    """The tool results of the last request, as the model received them."""
    body = fake.requests[-1].body
    if kind == "anthropic":
        return [b["content"] for b in body["messages"][-1]["content"] if b["type"] == "tool_result"]
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def converse(kind: str, fake: FakeLLM, env: ToolEnv, *, tool_calls: int) -> Agent:
    tools = {t.name: t for t in kernel_tools()}
    agent = Agent(provider(kind, fake), PRICE, [t.spec() for t in tools.values()],
                  execute=lambda call: run_tool(tools, env, call), submitted=lambda: env.submission is not None,
                  limits=Limits(tool_calls=tool_calls), ledger=Ledger(0.0), card="card", transcript=Transcript(None))
    agent.run("system", "task")
    return agent


class BuildPool:
    """The evaluator pool's compile, on the real builder (the compile tool needs nothing else)."""

    backend = "cpu"

    def __init__(self, cache: Path) -> None:
        from forge_tui.evaluator.build import Builder

        self.builder = Builder("cpu", cache, parallel=1)
        self._exec = ThreadPoolExecutor(max_workers=1)

    def build(self, source: str) -> "Future[BuildReport]":
        return self._exec.submit(lambda: BuildReport.model_validate(self.builder.build(source).to_json()))

    def close(self) -> None:
        self._exec.shutdown()


def forge_toml(kind: str, fake: FakeLLM) -> str:
    return (FAST_TOML + f'\n[agent]\nprovider = "{kind}"\nmodel = "m"\nbase_url = '
            f'"{fake.base_url if kind == "anthropic" else fake.openai_base_url}"\nretries = 0\n'
            "input_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n")


# ---- 1: the compiler reads nothing outside -----------------------------------------------------------
OUTSIDE_HEADER = "leaked_token_alpha outside_value_beta;\nstruct outside_gamma { int delta; };\n"
GOOD = (Path(__file__).parent / "candidates" / "cpu" / "softmax_good.cpp").read_text()


@needs_gxx
@pytest.mark.parametrize("kind", KINDS)
def test_a_compile_including_a_file_outside_shows_the_model_nothing_of_it(tmp_path, secrets_env, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.h").write_text(OUTSIDE_HEADER)
    work = tmp_path / "work"
    work.mkdir()
    head = '#include "forge_kernel.h"\n'
    (work / "direct.cpp").write_text(GOOD.replace(head, f'{head}#include "{outside}/secret.h"\n'))
    (work / "macro.cpp").write_text(GOOD.replace(head, f'{head}#define OUT "{outside}/secret.h"\n#include OUT\n'))
    (work / "environ.cpp").write_text(GOOD.replace(head, f'{head}#define ENV "/proc/self/environ"\n#include ENV\n'))
    (work / "climb.cpp").write_text(GOOD.replace(head, f'{head}#include "../outside/secret.h"\n'))
    pool = BuildPool(tmp_path / "cache")
    try:
        with FakeLLM() as fake:
            fake.reply(turn(kind, *[("compile", {"file": f}) for f in ("direct.cpp", "macro.cpp", "environ.cpp",
                                                                       "climb.cpp")]),
                       turn(kind, ("list_files", {})))
            converse(kind, fake, ToolEnv(workdir=work, backend="cpu", pool=pool), tool_calls=5)
            direct, macro, environ, climb = results_sent(kind, fake)[:4]
    finally:
        pool.close()
    sent = json.dumps([r.body for r in fake.requests])
    for word in ("leaked_token_alpha", "outside_value_beta", "outside_gamma", KEY, TOKEN, "SOME_TOKEN"):
        assert word not in sent, word
    # the model is told why, in one line naming the include
    assert "compile direct.cpp: FAILED" in direct and f'#include "{outside}/secret.h" is refused: an absolute path' in direct
    assert "compile climb.cpp: FAILED" in climb and "climbs with '..'" in climb
    for result, path in ((macro, f"{outside}/secret.h"), (environ, "/proc/self/environ")):
        assert "FAILED" in result and path in result, result
        assert "Permission denied" in result or "refused" in result, result


@needs_gxx
def test_the_compiler_runs_confined_with_a_scrubbed_environment(tmp_path, secrets_env):
    """Where the kernel has Landlock the compile reads nothing outside its roots; everywhere the
    preprocessor's dependency list refuses a file outside before anything is compiled, and the
    compiler's environment holds no secret."""
    from forge_tui.evaluator import jail
    from forge_tui.evaluator.build import Builder, compile_env, toolchain

    (tmp_path / "notes.txt").write_text("int from_outside;\n")
    head = '#include "forge_kernel.h"\n'
    src = GOOD.replace(head, f'{head}#define OUT "{tmp_path}/notes.txt"\n#include OUT\n')
    for landlock in (True, False):
        b = Builder("cpu", tmp_path / f"cache-{landlock}", landlock=landlock)
        r = b.build(src)
        assert not r.ok and r.library is None and "from_outside" not in r.log + r.reason
        if landlock and jail.abi():
            assert "Permission denied" in r.reason and r.confined.startswith("landlock ABI")
        else:
            assert r.reason == (f"the compile would read {tmp_path}/notes.txt, outside the build folder, the ABI "
                                "header and the toolchain's include folders: refused")
        ok = b.build(GOOD + f"\n// {landlock}\n")
        assert ok.ok and "scrubbed environment" in ok.confined and b.build(GOOD + f"\n// {landlock}\n").cached
    env = compile_env(tmp_path, toolchain("cpu", "g++"))
    assert KEY not in env.values() and TOKEN not in env.values() and env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_MESSAGES", "LD_LIBRARY_PATH", "CUDA_HOME",
                        "CUDA_PATH", "CUDA_ROOT"}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_jail_refuses_reads_outside_network_and_keeps_exec(tmp_path):
    """What ``jail.py`` applies to a compile, seen from inside: the toolchain runs (fork and exec
    included), files outside its roots and /proc are refused, a socket is refused."""
    from forge_tui.evaluator import jail
    from forge_tui.evaluator.build import JAIL, Builder, toolchain

    if not jail.abi():
        pytest.skip("no Landlock in this kernel")
    (tmp_path / "outside.txt").write_text("outside\n")
    box = tmp_path / "box"
    box.mkdir()
    prefix, note, landlocked = Builder("cpu", tmp_path)._jail(box, toolchain("cpu", "g++"))
    assert landlocked and prefix[-1] == "--" and str(JAIL) in prefix

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *cmd], capture_output=True, text=True, cwd=box)

    assert run("sh", "-c", "echo made > made.txt && cat made.txt").stdout == "made\n"  # fork, exec, write inside
    for path in (tmp_path / "outside.txt", "/etc/passwd", f"/proc/{os.getpid()}/environ"):
        r = run("cat", str(path))
        assert r.returncode != 0 and "Permission denied" in r.stderr, (path, r)
    r = run("sh", "-c", f"echo x > {tmp_path}/escaped.txt")
    assert r.returncode != 0 and not (tmp_path / "escaped.txt").exists()
    if os.path.isfile("/usr/bin/python3"):  # a program of the toolchain's roots that can open a socket
        r = run("/usr/bin/python3", "-I", "-S", "-c", "import socket; socket.socket()")
        assert r.returncode != 0 and "Operation not permitted" in r.stderr, r


def test_the_include_checker_refuses_what_would_read_outside():
    from forge_tui.evaluator.includes import outside, parse_dependencies, source_problems

    dirs = ["/usr/include"] if os.path.isfile("/usr/include/stdint.h") else None
    src = "\n".join([
        '#include "forge_kernel.h"',  # 1: the ABI header
        "#include <stdint.h>",  # 2: a toolchain header
        '#include "/etc/passwd"',  # 3
        "#  include_next <../../etc/shadow>",  # 4
        '// #include "/in/a/comment"',  # 5
        '#include "not_a_header_anywhere.h"',  # 6
        'asm(".incbin \\"/etc/hostname\\"");',  # 7
        "#if __has_include(</root/.ssh/id_rsa>)",  # 8
        "#endif",
        "#inc\\",  # 10: a directive split by a continuation
        'lude "/split/over/lines"',
        "#define H <stdint.h>",
        "#include H",  # 13: through a macro, for the dependency list
    ])
    problems = source_problems(src, "forge_kernel.h", dirs)
    lines = [line for line, _ in problems]
    assert lines == ([3, 4, 6, 10, 8, 7] if dirs else [3, 4, 10, 8, 7])
    text = dict(problems)
    assert text[3].startswith('#include "/etc/passwd" is refused: an absolute path')
    assert "climbs with '..'" in text[4] and ".incbin" in text[7] and "__has_include(</root/.ssh/id_rsa>)" in text[8]
    if dirs:
        assert "neither the ABI header (forge_kernel.h) nor a header of the toolchain" in text[6]
    assert source_problems('#include "forge_kernel.h"\n#include <cmath>\n', "forge_kernel.h") == []
    deps = parse_dependencies("candidate.o: candidate.cpp /usr/include/stdint.h \\\n /tmp/x\\ y.h ../up.h\n")
    assert deps == ["candidate.cpp", "/usr/include/stdint.h", "/tmp/x y.h", "../up.h"]
    assert outside(deps, "/build/b1", ["/build/b1", "/usr/include"]) == ["/tmp/x y.h", "../up.h"]


def test_the_static_checks_refuse_outside_includes():
    from forge_tui.evaluator.static_checks import check_source

    findings = check_source(GOOD.replace('#include "forge_kernel.h"\n', '#include "forge_kernel.h"\n'
                                         '#include "/home/me/.aws/credentials"\n'), "cpu")
    (f,) = [f for f in findings if f.rule == "include"]
    assert f.severity == "error" and f.line == 4 and "an absolute path" in f.message


# ---- 2: no link followed by the harness --------------------------------------------------------------
OUTSIDE_TEXT = "the outside file's own words, never to be committed\n"


@pytest.mark.parametrize("kind", KINDS)
def test_a_draft_planted_as_a_link_is_refused_and_never_committed(tmp_path, secrets_env, kind):
    from search_helpers import FakePool, make_workspace, synthetic_card

    from forge_tui.agent import build_agent
    from forge_tui.config import parse_config
    from forge_tui.search.events import NodeAdded, ProposerFailed, Recorder
    from forge_tui.search.runner import Search

    outside = tmp_path / "outside.cpp"
    outside.write_text(OUTSIDE_TEXT)
    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])

    def plant() -> None:
        """While the model "thinks", something outside swaps the draft for a link to a file outside."""
        (conv,) = (ws.root / ".forge" / "agent").iterdir()
        (conv / "candidate.cpp").unlink()
        os.symlink(outside, conv / "candidate.cpp")

    with FakeLLM() as fake:
        cfg = parse_config({"search": {"max_evals": 1, "parallel": 1}, "agent": {
            "provider": "anthropic" if kind == "anthropic" else "openai", "model": "m",
            "base_url": fake.base_url if kind == "anthropic" else fake.openai_base_url, "input_usd_per_mtok": 3.0,
            "output_usd_per_mtok": 15.0, "retries": 0, "max_tool_calls": 1}})
        fake.reply(turn(kind, ("list_files", {}), before=plant))
        pool = FakePool()
        rec = Recorder()
        search = Search(ws, cfg, build_agent(cfg, ws.root), pool)
        search.bus.subscribe(rec)
        search.run()
    # the first conversation ended (its one tool call spent) without a draft it could take; the
    # later ones found no scripted reply and failed at the server
    assert pool.calls == [] and not [e for e in rec.events if isinstance(e, NodeAdded) and not e.is_root]
    failed = next(e for e in rec.events if isinstance(e, ProposerFailed))
    assert "its draft was not read: candidate.cpp is a symbolic link" in failed.reason, failed.reason
    history = subprocess.run(["git", "-C", str(ws.root), "log", "--all", "-p"], capture_output=True, text=True).stdout
    assert OUTSIDE_TEXT.strip() not in history and "symbolic link" in history
    assert outside.read_text() == OUTSIDE_TEXT


def test_the_harness_reads_of_agent_folders_refuse_links(tmp_path):
    """Every read of a file the agent could have touched goes through safeio: the proposer's draft,
    the transcript read back after a crash, the reference's draft in forge new."""
    from forge_tui.agent.proposer import read_draft
    from forge_tui.agent.transcript import Transcript, read_entries

    outside = tmp_path / "outside.txt"
    outside.write_text('{"type": "query", "cost_usd": 99}\n')
    conv = tmp_path / "conv"
    conv.mkdir()
    (conv / "candidate.cpp").symlink_to(outside)
    (conv / "transcript.jsonl").symlink_to(outside)
    assert read_draft(conv, "candidate.cpp") == ("", "candidate.cpp is a symbolic link: links are not followed (one "
                                                     "may lead outside the working directory)")
    assert read_draft(conv, "missing.cpp") == ("", "")
    assert read_entries(conv / "transcript.jsonl") == []
    with pytest.raises(OSError):
        Transcript(conv / "transcript.jsonl").add("start")  # never appended through the link
    assert outside.read_text() == '{"type": "query", "cost_usd": 99}\n'
    (conv / "real.cpp").write_text("int x;\n")
    assert read_draft(conv, "real.cpp") == ("int x;\n", "")


def test_the_no_follow_reader(tmp_path):
    from forge_tui import safeio

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    (root / "dirlink").symlink_to(root / "sub")
    os.mkfifo(root / "fifo")
    assert safeio.read_text(root, "sub/f.txt") == ("sub/f.txt", "inside\n")
    assert safeio.read_beside(root / "sub" / "f.txt") == b"inside\n"
    for path, words in (("link.txt", "link.txt is a symbolic link"), ("dirlink/f.txt", "dirlink is a symbolic link"),
                        ("../outside.txt", "'..'"), (str(tmp_path / "outside.txt"), "absolute path"),
                        ("fifo", "not a regular file"), ("sub", "is a folder")):
        with pytest.raises(safeio.Refused, match=words):
            safeio.read_bytes(root, path)
    with pytest.raises(safeio.Missing):
        safeio.read_bytes(root, "none.txt")
    with pytest.raises(safeio.Refused, match="7 bytes, over the 3-byte limit"):
        safeio.read_bytes(root, "sub/f.txt", limit=3)
    (root / "bin").write_bytes(b"a\x00b")
    with pytest.raises(safeio.Refused, match="binary"):
        safeio.read_text(root, "bin")
    assert safeio.read_text(root, "bin", strict=False)[1] == "a\x00b"


# ---- 3: the reference run reads nothing outside ----------------------------------------------------------
PRYING_REFERENCE = '''import os
import torch


def reference(x):
    for path in ("/proc/%d/environ" % os.getppid(), {outside!r}, "/etc/passwd"):
        try:
            with open(path, "rb") as f:
                print("READ", path, f.read()[:3000])
        except OSError as exc:
            print("REFUSED", path, exc)
    try:
        with open({escape!r}, "w") as f:
            f.write("written from the reference")
    except OSError as exc:
        print("REFUSED", {escape!r}, exc)
    return x * 2


def example_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 8, generator=g).to(device)]
'''


@pytest.mark.parametrize("kind", KINDS)
def test_forge_new_runs_a_prying_reference_confined_in_try_and_in_accept(tmp_path, kind):
    """``forge new --yes`` as a user runs it, its own process started with the key in its
    environment: the reference reads its parent's /proc/PID/environ, a file outside and
    /etc/passwd, and writes a file outside; try_reference tells the model each was refused and
    shows none of them, and the accept step (which runs the reference again to profile it) cannot
    write outside either."""
    from forge_tui.evaluator import jail

    if not jail.abi():
        pytest.skip("no Landlock in this kernel: reads are not confined")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside words for nobody\n")
    escape = tmp_path / "escaped.txt"
    var = "ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY"
    marker = "visible-marker-" + "m4" * 8
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), var: KEY, "SOME_TOKEN": TOKEN, "FORGE_MARKER": marker,
           "FORGE_CACHE_DIR": os.environ.get("FORGE_CACHE_DIR", str(tmp_path / "cache"))}
    source = PRYING_REFERENCE.format(outside=str(outside), escape=str(escape))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from forge_tui.cli import main; "
            "sys.exit(main(sys.argv[2:]))")
    with FakeLLM() as fake:
        (tmp_path / "forge.toml").write_text(forge_toml(kind, fake))
        fake.reply(turn(kind, ("write_file", {"path": "reference.py", "content": source}), ("try_reference", {})),
                   turn(kind, ("submit", {"summary": "x * 2 on an (8, 8) fp32 tensor"})))
        run = subprocess.run([sys.executable, "-c", code, str(ROOT), "new", "double a tensor", "-w",
                              str(tmp_path / "ws"), "--yes", "--device", "cpu"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=900)
        tried = results_sent(kind, fake)[1]
    assert run.returncode == 0, run.stderr[-3000:]
    assert "try_reference reference.py: OK" in tried, tried
    for path in ("/proc/", str(outside), "/etc/passwd", str(escape)):
        assert f"REFUSED {path}" in tried, (path, tried)
    assert "READ " not in tried
    everything = json.dumps([r.body for r in fake.requests]) + run.stdout + run.stderr
    for word in (marker, "outside words", "root:x:0:0", KEY, TOKEN):
        assert word not in everything, word
    assert not escape.exists()  # neither try_reference nor the accept's profile wrote it
    assert (tmp_path / "ws" / "reference.py").read_text() == source


def test_run_reference_reads_only_its_folder_and_python(tmp_path):
    from agent_tools.reference import run_reference
    from forge_tui.evaluator import jail

    if not jail.abi():
        pytest.skip("no Landlock in this kernel")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside.txt").write_text("outside words\n")
    (work / "data.txt").write_text("inside words\n")
    (work / "reference.py").write_text(
        "import os, torch\n\n\ndef reference(x):\n"
        f"    print(open('data.txt').read(), open({str(tmp_path / 'outside.txt')!r}).read())\n    return x\n\n\n"
        "def example_inputs(device='cpu'):\n    return [torch.ones(4)]\n")
    rep = run_reference(work, wall_s=120)
    assert not rep.ok and rep.stage == "call" and rep.refused and rep.landlock.startswith("landlock ABI")
    assert "PermissionError: [Errno 13] Permission denied" in rep.error and "outside words" not in rep.text()
    assert "reads confined by landlock ABI" in rep.text()
    assert jail._libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE: this process is no longer dumpable


# ---- 4: no secret in a tool result or a commit ---------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_no_tool_result_reaches_the_model_with_a_secret(tmp_path, secrets_env, kind):
    work = tmp_path / "work"
    work.mkdir()
    aws = "AKIA" + "ABCDEFGHIJ234567"
    (work / "notes.txt").write_text(f"key {KEY}\ntoken {TOKEN}\naws {aws}\ngithub ghp_{'a1' * 18}\nplain words\n")
    with FakeLLM() as fake:
        fake.reply(turn(kind, ("read_file", {"path": "notes.txt"})), turn(kind, ("list_files", {})))
        converse(kind, fake, ToolEnv(workdir=work, backend="cpu"), tool_calls=2)
        (shown,) = results_sent(kind, fake)
    sent = json.dumps([r.body for r in fake.requests])
    for secret in (KEY, TOKEN, aws, "ghp_a1a1"):
        assert secret not in sent, secret
    assert shown.count("[redacted]") == 4 and "plain words" in shown


def test_the_git_wrapper_refuses_a_file_holding_a_secret_and_names_the_variable(tmp_path, secrets_env):
    from forge_tui.gitrepo import GitRepo, SecretInCommit

    repo_dir = tmp_path / "repo"
    repo_dir.mkdir()
    (repo_dir / "fine.txt").write_text("nothing here\n")
    with GitRepo.init(repo_dir) as repo:
        first = repo.commit_worktree("first")
        (repo_dir / "reference.py").write_text(f'TOKEN = "{TOKEN}"\n')
        with pytest.raises(SecretInCommit) as err:
            repo.commit_worktree("add the reference")
        assert str(err.value) == ("refusing to commit reference.py: it holds the value of $SOME_TOKEN (not shown); "
                                  "nothing was committed: remove the secret first")
        assert repo.head() == first and repo.git("diff", "--cached", "--name-only") == ""  # unstaged again
        (repo_dir / "reference.py").write_text("print('clean')\n")
        with pytest.raises(SecretInCommit, match=r"the commit message: it holds the value of \$ANTHROPIC_API_KEY"):
            repo.commit_worktree("subject", f"body with {KEY}")
        assert repo.commit_worktree("add the clean reference") != first
        from forge_tui.gitrepo import ObjectWriter

        with pytest.raises(SecretInCommit, match=r"candidate/candidate.cpp: it holds the value of \$ANTHROPIC_API_KEY"):
            ObjectWriter(repo).commit_files(None, "candidate", {"candidate.cpp": f"// {KEY}\n".encode()}, [], "node")
    log = subprocess.run(["git", "-C", str(repo_dir), "log", "--all", "-p"], capture_output=True, text=True).stdout
    assert TOKEN not in log and KEY not in log


def test_redaction_names_and_shapes():
    from forge_tui.redaction import find_secrets, redact, treat_as_secret

    env = {"SOME_TOKEN": TOKEN, "DB_PASSWORD": "hunter2hunter2", "MY_LLM_KEY_VAR": "short", "HOME": "/home/someone",
           "CUSTOM": "custom-value-1"}
    text = (f"{TOKEN} hunter2hunter2 short /home/someone custom-value-1 sk-ant-api03-{'x' * 20} "
            f"sk-proj-{'y' * 30} AKIAABCDEFGHIJ234567 ghp_{'b' * 36} mask-based-approach-with-long-name")
    out = redact(text, env)
    assert out == ("[redacted] [redacted] short /home/someone custom-value-1 [redacted] [redacted] [redacted] "
                   "[redacted] mask-based-approach-with-long-name")
    assert "custom-value-1" not in redact(text, env, ["CUSTOM"])
    treat_as_secret("CUSTOM")
    assert find_secrets(b"x custom-value-1 y", env) == ["the value of $CUSTOM"]
    assert find_secrets(f"token={TOKEN}\n-----BEGIN RSA PRIVATE KEY-----\nabc\n", env) == [
        "the value of $SOME_TOKEN", "a private key (-----BEGIN ... PRIVATE KEY-----)"]
    assert find_secrets("nothing to see", env) == []


KEYED_REFERENCE = '''import torch

API = "{value}"


def reference(x):
    return x * 2


def example_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 8, generator=g).to(device)]
'''



@pytest.mark.parametrize("kind", KINDS)
def test_forge_new_yes_neither_commits_nor_prints_a_reference_holding_a_key(tmp_path, secrets_env, monkeypatch,
                                                                             capsys, kind):
    from forge_tui.cli import main

    var = "ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY"
    value = os.environ[var]
    monkeypatch.chdir(tmp_path)
    with FakeLLM() as fake:
        (tmp_path / "forge.toml").write_text(forge_toml(kind, fake))
        fake.reply(turn(kind, ("write_file", {"path": "reference.py", "content": KEYED_REFERENCE.format(value=value)}),
                        ("try_reference", {})),
                   turn(kind, ("submit", {"summary": "x * 2 on an (8, 8) fp32 tensor"})))
        code = main(["new", "double a tensor", "-w", str(tmp_path / "ws"), "--yes", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code != 0 and not (tmp_path / "ws").exists()
    assert value not in out + err and 'API = "[redacted]"' in out
    assert err.strip() == (f"forge: error: refusing to commit reference.py: it holds the value of ${var} (not shown); "
                           "nothing was committed: remove the secret first")
