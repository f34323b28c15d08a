"""The agent's tools (agent_tools), without the app or a model: the file tools stay inside the working
directory whatever path they are given (``..``, absolute paths, symbolic links as the last or a
middle component, swapped in between calls, overlong names); the same Tool definitions render to
Anthropic's and OpenAI's formats; a bad call comes back as an error result, never an exception; and
compile, run_tests, profile and submit give the model what it needs on the real CPU evaluator."""

import json
import math
import os
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent_tools import Submission, Tool, ToolEnv, ToolError, file_tools, kernel_tools, run_tool
from agent_tools.base import MAX_RESULT_CHARS, Params
from forge_tui.agent.messages import ToolCall
from forge_tui.compare import compare

HERE = Path(__file__).parent
CPU = HERE / "candidates" / "cpu"
SECRET = "the secret outside the working directory\n"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

TOOLS = {t.name: t for t in kernel_tools()}


def call(env, name, **arguments):
    return run_tool(TOOLS, env, ToolCall(id="c1", name=name, arguments=arguments))


@pytest.fixture
def box(tmp_path):
    """A working directory with a read-only card.json and a candidate, beside a folder outside it
    holding a secret; links inside the working directory point out of it."""
    work = tmp_path / "work"
    outside = tmp_path / "outside"
    work.mkdir()
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET)
    (outside / "sub" / "inner.txt").write_text(SECRET)
    (work / "card.json").write_text('{"id": "softmax"}\n')
    (work / "candidate.cpp").write_text("int f() { return 1; }\n")
    os.symlink(outside / "secret.txt", work / "link_file")
    os.symlink(outside, work / "link_dir")
    env = ToolEnv(workdir=work, backend="cpu", read_only={"card.json"})
    return env, outside


def outside_untouched(outside: Path) -> None:
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == ["secret.txt", "sub", "sub/inner.txt"]
    assert (outside / "secret.txt").read_text() == SECRET
    assert (outside / "sub" / "inner.txt").read_text() == SECRET


def refused(result, *words):
    assert result.is_error, result.content
    assert "secret outside" not in result.content
    for w in words:
        assert w in result.content, result.content


def every_tool(path):
    """One call of each file tool on ``path`` (list_files on its folder form)."""
    return [("read_file", {"path": path}), ("write_file", {"path": path, "content": "pwned\n"}),
            ("edit_file", {"path": path, "old": "secret", "new": "pwned"}), ("list_files", {"path": path})]


# ---- escapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../outside/secret.txt", "sub/../../outside/secret.txt", "..", "./../outside"])
def test_dotdot_is_refused_by_every_file_tool(box, path):
    env, outside = box
    for name, args in every_tool(path):
        refused(call(env, name, **args), "'..'")
    outside_untouched(outside)
    assert not (env.workdir / "sub").exists()  # write_file made no folder on the way


def test_absolute_paths_are_refused_by_every_file_tool(box):
    env, outside = box
    for path in (str(outside / "secret.txt"), str(outside), "/etc/passwd", "//etc/passwd"):
        for name, args in every_tool(path):
            refused(call(env, name, **args), "absolute path")
    outside_untouched(outside)


def test_a_symlink_as_last_component_is_refused_by_every_file_tool(box):
    env, outside = box
    for path in ("link_file", "link_dir", "./link_file"):
        for name, args in every_tool(path):
            refused(call(env, name, **args), "symbolic link")
    outside_untouched(outside)
    assert (env.workdir / "link_file").is_symlink() and (env.workdir / "link_dir").is_symlink()  # not replaced


def test_a_symlink_as_a_folder_component_is_refused_by_every_file_tool(box):
    env, outside = box
    for path in ("link_dir/secret.txt", "link_dir/sub/inner.txt", "link_dir/new.txt", "link_dir/deeper/new.txt",
                 "link_dir/sub"):
        for name, args in every_tool(path):
            refused(call(env, name, **args), "link_dir is a symbolic link")
    outside_untouched(outside)


def test_a_symlink_deeper_inside_the_workdir_is_refused_too(box):
    env, outside = box
    (env.workdir / "a" / "b").mkdir(parents=True)
    os.symlink(outside / "sub", env.workdir / "a" / "b" / "c")
    for name, args in every_tool("a/b/c/inner.txt"):
        refused(call(env, name, **args), "a/b/c is a symbolic link")
    outside_untouched(outside)


def test_a_folder_swapped_for_a_symlink_between_calls_is_not_followed(box):
    env, outside = box
    assert not call(env, "write_file", path="d/notes.txt", content="mine\n").is_error
    shutil.rmtree(env.workdir / "d")
    os.symlink(outside / "sub", env.workdir / "d")
    refused(call(env, "write_file", path="d/notes.txt", content="pwned\n"), "symbolic link")
    refused(call(env, "write_file", path="d/inner.txt", content="pwned\n"), "symbolic link")
    refused(call(env, "read_file", path="d/inner.txt"), "symbolic link")
    outside_untouched(outside)


def test_a_folder_swapped_for_a_symlink_while_the_path_is_opened_is_not_followed(box, monkeypatch):
    """The swap lands after any check a tool might make and just before it opens the folder: only
    opening each component without following links refuses it."""
    env, outside = box
    (env.workdir / "d").mkdir()
    real_open = os.open
    swapped = []

    def racing_open(path, flags, *args, **kwargs):
        if path == "d" and not swapped:
            swapped.append(True)
            os.rmdir(env.workdir / "d")
            os.symlink(outside / "sub", env.workdir / "d")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    refused(call(env, "write_file", path="d/inner.txt", content="pwned\n"), "symbolic link")
    assert swapped
    monkeypatch.setattr(os, "open", real_open)
    outside_untouched(outside)


def test_a_hard_link_is_replaced_not_written_through(box):
    env, outside = box
    os.link(outside / "secret.txt", env.workdir / "hard.txt")
    assert not call(env, "write_file", path="hard.txt", content="mine\n").is_error
    assert (env.workdir / "hard.txt").read_text() == "mine\n"
    outside_untouched(outside)


@pytest.mark.parametrize("path, words", [
    ("x" * 256, ["256 bytes long", "255-byte limit"]),
    ("é" * 128, ["256 bytes long", "255-byte limit"]),  # bytes, not characters
    ("/".join(["d" * 200] * 6), ["over the 1024-byte limit"]),
    ("a\x00b", ["NUL byte"]),
    ("", ["empty path"]),
    ("a\nb", ["control characters"]),
])
def test_bad_names_are_refused_by_every_file_tool(box, path, words):
    env, outside = box
    before = sorted(os.listdir(env.workdir))
    for name, args in every_tool(path):
        refused(call(env, name, **args), *words)
    assert sorted(os.listdir(env.workdir)) == before
    outside_untouched(outside)


def test_binary_and_oversized_files_are_refused_with_their_size(box):
    env, _ = box
    (env.workdir / "blob.bin").write_bytes(b"\x7fELF\x00\x01" * 100)
    (env.workdir / "latin1.txt").write_bytes("café".encode("latin-1"))
    refused(call(env, "read_file", path="blob.bin"), "binary", "600 bytes")
    refused(call(env, "edit_file", path="blob.bin", old="ELF", new="FLE"), "binary")
    refused(call(env, "read_file", path="latin1.txt"), "binary or not UTF-8")
    small = ToolEnv(workdir=env.workdir, max_read_bytes=100, max_write_bytes=100)
    (env.workdir / "big.txt").write_text("y" * 101)
    refused(call(small, "read_file", path="big.txt"), "101 bytes", "100-byte limit")
    refused(call(small, "edit_file", path="big.txt", old="y", new="z"), "101 bytes")


def test_nul_content_and_oversized_writes_are_refused_and_write_nothing(box):
    env, _ = box
    refused(call(env, "write_file", path="n.txt", content="a\x00b"), "NUL byte")
    small = ToolEnv(workdir=env.workdir, max_write_bytes=100)
    refused(call(small, "write_file", path="big.txt", content="y" * 101), "101 bytes", "100-byte limit")
    refused(call(small, "write_file", path="sub/big.txt", content="é" * 51), "102 bytes")  # bytes, not characters
    refused(call(env, "edit_file", path="candidate.cpp", old="return 1", new="return 1\x00"), "NUL byte")
    assert not (env.workdir / "n.txt").exists() and not (env.workdir / "big.txt").exists()
    assert (env.workdir / "candidate.cpp").read_text() == "int f() { return 1; }\n"
    assert not [n for n in os.listdir(env.workdir) if n.startswith(".forge-write")]  # no temporary left over


def test_read_only_names_cannot_be_overwritten(box):
    env, _ = box
    for path in ("card.json", "./card.json", "card.json/"):
        refused(call(env, "write_file", path=path, content="{}"), "read-only")
        refused(call(env, "edit_file", path=path, old="softmax", new="x"), "read-only")
    assert (env.workdir / "card.json").read_text() == '{"id": "softmax"}\n'
    r = call(env, "read_file", path="card.json")
    assert not r.is_error and "softmax" in r.content and "read-only" in r.content
    ro_folder = ToolEnv(workdir=env.workdir, read_only={"parents"})
    refused(call(ro_folder, "write_file", path="parents/p1.cpp", content="x"), "read-only")
    assert not (env.workdir / "parents").exists()


def test_not_a_file_not_a_folder_and_missing(box):
    env, _ = box
    (env.workdir / "dir").mkdir()
    refused(call(env, "read_file", path="dir"), "is a folder")
    refused(call(env, "write_file", path="dir", content="x"), "is a folder")
    refused(call(env, "list_files", path="candidate.cpp"), "not a folder")
    refused(call(env, "read_file", path="candidate.cpp/x"), "not a folder")
    refused(call(env, "read_file", path="missing.cpp"), "no such file")
    refused(call(env, "list_files", path="missing"), "no such folder")
    os.mkfifo(env.workdir / "fifo")
    refused(call(env, "read_file", path="fifo"), "not a regular file")  # and does not hang


# ---- the file tools at work -------------------------------------------------------------------
def test_write_read_edit_and_list(box):
    env, _ = box
    r = call(env, "write_file", path="src/k.cpp", content="int a = 1;\nint b = 2;\nint b2 = 2;\n")
    assert not r.is_error and "src/k.cpp" in r.content and "3 lines" in r.content
    r = call(env, "read_file", path="src/k.cpp")
    assert r.content.splitlines()[1:] == ["     1\tint a = 1;", "     2\tint b = 2;", "     3\tint b2 = 2;"]
    r = call(env, "read_file", path="src/k.cpp", offset_line=2, max_lines=1)
    assert "     2\tint b = 2;" in r.content and "int a" not in r.content and "offset_line=3" in r.content
    refused(call(env, "edit_file", path="src/k.cpp", old="int c", new="x"), "found 0 times")
    refused(call(env, "edit_file", path="src/k.cpp", old="= 2;", new="= 3;"), "found 2 times")
    r = call(env, "edit_file", path="src/k.cpp", old="int b2 = 2;", new="int b2 = 3;")
    assert not r.is_error and "line 3" in r.content
    assert (env.workdir / "src" / "k.cpp").read_text() == "int a = 1;\nint b = 2;\nint b2 = 3;\n"
    r = call(env, "list_files")
    lines = r.content.splitlines()
    assert "src/" in lines and "candidate.cpp  22 bytes" in lines and "card.json  18 bytes (read-only)" in lines
    assert "link_dir@ (symbolic link, not followed)" in lines and "link_file@ (symbolic link, not followed)" in lines
    assert call(env, "list_files", path="src").content.splitlines() == ["src: 1 entry", "k.cpp  34 bytes"]


def test_long_files_are_shown_in_parts(box):
    env, _ = box
    (env.workdir / "long.txt").write_text("".join(f"line {i} " + "x" * 100 + "\n" for i in range(1, 2001)))
    r = call(env, "read_file", path="long.txt", max_lines=5000)
    assert not r.is_error and len(r.content) < MAX_RESULT_CHARS
    last = int(r.content.splitlines()[-2].split("\t")[0])
    assert 100 < last < 2000 and f"offset_line={last + 1}" in r.content.splitlines()[-1]


# ---- tools are data: one definition, both providers' formats ------------------------------------
def _keys(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            if k != "properties":
                yield from _keys(v)
            else:
                for sub in v.values():
                    yield from _keys(sub)
    elif isinstance(node, list):
        for x in node:
            yield from _keys(x)


def test_every_tool_renders_to_anthropic_and_openai_with_the_same_schema():
    tools = kernel_tools()
    assert [t.name for t in tools] == ["read_file", "write_file", "edit_file", "list_files", "compile", "run_tests",
                                       "profile", "submit"]
    assert [t.name for t in file_tools()] == ["read_file", "write_file", "edit_file", "list_files"]
    for t in tools:
        spec = t.spec()
        a, o = spec.anthropic(), spec.openai()
        assert set(a) == {"name", "description", "input_schema"} and a["name"] == t.name and a["description"]
        assert o["type"] == "function" and set(o["function"]) == {"name", "description", "parameters"}
        assert o["function"]["name"] == t.name and o["function"]["description"] == a["description"]
        schema = a["input_schema"]
        assert schema == o["function"]["parameters"]
        assert json.loads(json.dumps(schema)) == schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])
        assert "title" not in set(_keys(schema)) and "$defs" not in set(_keys(schema)) and "anyOf" not in set(_keys(schema))
        for name, prop in schema["properties"].items():
            assert prop.get("description") and prop.get("type") in ("string", "integer"), (t.name, name, prop)
    by_name = {t.name: t.spec().parameters for t in tools}
    assert by_name["read_file"]["required"] == ["path"]
    assert by_name["edit_file"]["required"] == ["path", "old", "new"]
    assert by_name["compile"]["required"] == [] and by_name["compile"]["properties"]["file"]["type"] == "string"
    assert by_name["submit"]["required"] == ["move"] and by_name["submit"]["properties"]["move"]["maxLength"] == 200


def test_a_property_named_title_survives_the_cleaning():
    class P(Params):
        title: str

    spec = Tool("t", "d", P, lambda env, p: p.title).spec()
    assert spec.parameters["properties"] == {"title": {"type": "string"}} and spec.parameters["required"] == ["title"]


def test_a_params_model_must_forbid_extra_arguments():
    class Loose(BaseModel):
        x: int = 0

    with pytest.raises(ValueError, match="extra"):
        Tool("loose", "d", Loose, lambda env, p: "")


# ---- run_tool never raises --------------------------------------------------------------------
def test_unknown_tool_bad_arguments_and_validation_errors_are_error_results(box):
    env, _ = box
    r = run_tool(TOOLS, env, ToolCall(id="x", name="rm_rf", arguments={}))
    assert r.is_error and r.call_id == "x" and r.name == "rm_rf" and "unknown tool" in r.content
    assert all(name in r.content for name in TOOLS)
    r = run_tool(TOOLS, env, ToolCall(id="x", name="read_file", raw_arguments='{"path": "a', arguments_error="unterminated string"))
    assert r.is_error and "not a JSON object" in r.content and "unterminated string" in r.content
    r = call(env, "read_file")
    assert r.is_error and "invalid arguments for read_file" in r.content and "- path: Field required" in r.content
    r = call(env, "read_file", path="candidate.cpp", offset_line="first")
    assert r.is_error and "- offset_line:" in r.content
    r = call(env, "read_file", path="candidate.cpp", offset_line=0)
    assert r.is_error and "- offset_line:" in r.content and "greater than or equal to 1" in r.content
    r = call(env, "read_file", path="candidate.cpp", mode="rb")
    assert r.is_error and "- mode: unknown argument" in r.content
    r = call(env, "write_file", path=["a"], content=3)
    assert r.is_error and "- path:" in r.content and "- content:" in r.content
    r = call(env, "submit", move="x" * 201)
    assert r.is_error and "- move:" in r.content and env.submission is None


def test_tool_errors_bugs_and_long_answers():
    class P(Params):
        what: str = "ok"

    def fn(env, p):
        if p.what == "refuse":
            raise ToolError("no, because")
        if p.what == "bug":
            raise RuntimeError("kaput")
        if p.what == "long":
            return "z" * (3 * MAX_RESULT_CHARS)
        return "fine"

    tools = [Tool("t", "a test tool", P, fn)]  # a list works as well as a mapping
    env = ToolEnv(workdir=Path("."))

    def go(what):
        return run_tool(tools, env, ToolCall(id="1", name="t", arguments={"what": what}))

    assert go("ok").content == "fine" and not go("ok").is_error
    assert go("refuse").is_error and go("refuse").content == "no, because"
    assert go("bug").is_error and go("bug").content == "internal error in tool t: RuntimeError: kaput"
    long = go("long")
    assert not long.is_error and len(long.content) < MAX_RESULT_CHARS + 200
    assert "truncated" in long.content and str(3 * MAX_RESULT_CHARS) in long.content


def test_first_mismatches_name_index_got_and_expected():
    import torch

    e = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = e.clone()
    a[1, 2] = 100.0
    a[2, 0] = float("nan")
    m = compare(a, e)
    assert len(m.first) == 1 and m.first[0].index == (2, 0) and math.isnan(m.first[0].got)  # NaN is checked first
    assert m.first[0].expected == 8.0
    a[2, 0] = 8.0
    m = compare(a, e)
    assert [(b.index, b.got, b.expected) for b in m.first] == [((1, 2), 100.0, 6.0)]
    assert "[1, 2] got 100 expected 6" in str(m)
    many = compare(e + 1, e)
    assert len(many.first) == 5 and many.first[0].index == (0, 0) and many.first[4].index == (1, 0)
    assert compare(e[:2], e).first == []  # a shape mismatch has no elements to show


# ---- the evaluator tools, on the real CPU evaluator --------------------------------------------
@pytest.fixture(scope="module")
def softmax_pool(tmp_path_factory, fast_cfg):
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("agent-tools")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\n")
    ws, _ = profile_into_workspace("example:kb_softmax", root / "ws", device="cpu", config_path=cfg)
    card = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    pool = LocalEvalPool(ws.store, ws.cache, fast_cfg, backend="cpu", workers=1)
    yield pool, card
    pool.close()


@pytest.fixture
def kenv(softmax_pool, tmp_path):
    pool, card = softmax_pool
    work = tmp_path / "node"
    work.mkdir()
    return ToolEnv(workdir=work, card=card, backend="cpu", pool=pool, read_only={"card.json"}, timeout_s=120)


def put(env, text, name="candidate.cpp"):
    (env.workdir / name).write_text(text)
    return text


@needs_gxx
def test_compile_reports_the_line_and_the_source_line_of_an_error(kenv):
    src = (CPU / "softmax_good.cpp").read_text()
    line = next(i for i, t in enumerate(src.splitlines(), 1) if t.strip() == "return 0;")
    put(kenv, src.replace("    return 0;", "    return 0"), "broken.cpp")
    r = call(kenv, "compile", file="broken.cpp")
    assert not r.is_error, r.content
    assert "compile broken.cpp: FAILED" in r.content
    assert f"broken.cpp:{line}:" in r.content and "error:" in r.content  # named as the model named it
    assert f"    {line:>5} |     return 0" in r.content.splitlines()
    r = call(kenv, "compile")  # the default file: candidate.cpp
    refused(r, "candidate.cpp: no such file")


@needs_gxx
def test_compile_ok_and_static_findings(kenv):
    put(kenv, (CPU / "softmax_good.cpp").read_text())
    r = call(kenv, "compile")
    assert not r.is_error and r.content.startswith("compile candidate.cpp: ok in ")
    assert "static checks (what the evaluator refuses before running a kernel): none" in r.content
    src = (CPU / "softmax_good.cpp").read_text().replace('#include "forge_kernel.h"\n',
                                                         '#include "forge_kernel.h"\nstatic int calls = 0;\n')
    put(kenv, src, "stateful.cpp")
    r = call(kenv, "compile", file="stateful.cpp")
    assert "ok in" in r.content and "line 4: error:" in r.content and "[no-state]" in r.content
    assert "        4 | static int calls = 0;" in r.content.splitlines() and "rejects this source" in r.content


@needs_gxx
def test_run_tests_names_the_failing_set_and_the_first_mismatches(kenv):
    put(kenv, (CPU / "softmax_no_max.cpp").read_text())
    r = call(kenv, "run_tests")
    assert not r.is_error
    text = r.content
    assert "FAILED (rejected: mismatch)" in text
    lines = text.splitlines()
    assert "  ok    captured-0" in lines and "  ok    random-0" in lines  # the sets before the failure passed
    fail = next(ln for ln in lines if ln.startswith("  FAIL  "))
    assert fail.startswith("  FAIL  adversarial-overflow: output 0: NaN where the reference has none")
    res = kenv.last_result
    assert res is not None and res.status == "rejected" and res.failure == "mismatch"
    first = res.detail["first_mismatches"]
    assert 1 <= len(first) <= 5 and all(len(m["index"]) == 2 for m in first)
    assert "first mismatches (index: got, expected):" in text
    m = first[0]
    assert f"[{m['index'][0]}, {m['index'][1]}]: got nan, expected {m['expected']:.8g}" in text
    assert "got nan" in res.reason  # the reason carries them too (the app and the CLI show it)


@needs_gxx
def test_run_tests_shows_got_and_expected_of_a_near_miss(kenv):
    src = (CPU / "softmax_good.cpp").read_text().replace("y[c] = (float)(std::exp((double)a[c] - m) * inv);",
                                                         "y[c] = (float)(std::exp((double)a[c] - m) * inv * 1.001);")
    put(kenv, src)
    r = call(kenv, "run_tests")
    assert "  FAIL  captured-0: output 0:" in r.content and "outside tolerance" in r.content
    first = kenv.last_result.detail["first_mismatches"]
    assert len(first) == 5
    for m in first:
        assert m["got"] == pytest.approx(m["expected"] * 1.001, rel=1e-5)
        assert f"got {m['got']:.8g}, expected {m['expected']:.8g}" in r.content


@needs_gxx
def test_run_tests_of_a_correct_kernel_reports_every_set_ok(kenv):
    put(kenv, (CPU / "softmax_good.cpp").read_text())
    r = call(kenv, "run_tests")
    assert not r.is_error and "PASSED: correct on all" in r.content
    sets = [s.name for s in kenv.last_result.correctness.sets]
    assert len(sets) >= 6 and kenv.last_result.timing is None
    for name in sets:
        assert f"  ok    {name} (bitwise)" in r.content.splitlines()


@needs_gxx
def test_profile_on_the_cpu_reports_timing_and_no_profiler(kenv):
    put(kenv, (CPU / "softmax_good.cpp").read_text())
    r = call(kenv, "profile")
    assert not r.is_error
    assert "time: candidate" in r.content and "spread" in r.content and "speedup vs eager" in r.content
    assert "profiler unavailable: " in r.content and "cpu backend" in r.content
    assert kenv.last_result.timing is not None


def test_submit_sets_the_submission(box):
    env, _ = box
    r = call(env, "submit", move="one pass per row", notes="try 4 rows per thread next")
    assert not r.is_error and "one pass per row" in r.content
    assert env.submission == Submission(source="int f() { return 1; }\n", move="one pass per row",
                                        file="candidate.cpp", notes="try 4 rows per thread next")
    refused(call(env, "submit", move="two\nlines"), "one line")
    refused(call(env, "submit", move="x", file="../outside/secret.txt"), "'..'")
    refused(call(env, "submit", move="x", file="link_file"), "symbolic link")
    assert env.submission.move == "one pass per row"  # refusals leave the submission alone
    (env.workdir / "empty.cpp").write_text("\n")
    refused(call(env, "submit", move="x", file="empty.cpp"), "empty")


class _SilentPool:
    backend = "cpu"

    def __init__(self):
        self.futures = []

    def _never(self, *args):
        f = Future()
        self.futures.append(f)
        return f

    build = check = profile = _never


def test_evaluator_tools_say_what_is_missing_and_do_not_wait_forever(box):
    env, _ = box
    for name in ("compile", "run_tests", "profile"):
        refused(call(env, name), "needs the evaluator")
    pool = _SilentPool()
    refused(call(ToolEnv(workdir=env.workdir, pool=pool), "run_tests"), "needs a card")
    quick = ToolEnv(workdir=env.workdir, pool=pool, card=object(), timeout_s=0.2)
    done = threading.Event()
    results = []

    def go():
        results.extend(call(quick, name) for name in ("compile", "run_tests", "profile"))
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(10)
    for r in results:
        refused(r, "the evaluator did not answer in 0.2 s")
    assert all(f.cancelled() for f in pool.futures)
