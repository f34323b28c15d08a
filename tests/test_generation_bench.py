"""``forge bench WORKLOAD --generate N`` on a tiny model (the CPU): the table's structure, the four
ways' token agreement, the bandwidth line, the rule for tokens that differ, and bad requests. No
figure is asserted: timings depend on the machine's load."""

import json

import pytest
import torch

from forge_tui.cli import main
from forge_tui.errors import ForgeError
from forge_tui.generation.bench import GAP_FLOOR, WAYS, _judge, generate_bench


def test_generate_bench_four_ways_on_a_tiny_decoder(decoder_workspace):
    # torch.compile with the "eager" backend: Dynamo traces the forward as it would for inductor,
    # without inductor's C++ builds, which take minutes on a busy CPU
    import torch._dynamo

    limit = torch._dynamo.config.recompile_limit
    r = generate_bench("example:tiny_decoder", decoder_workspace, 4, batches=(2, 1), device="cpu", repeats=2,
                       compile_backend="eager", bandwidth_Bps=1e10)
    assert torch._dynamo.config.recompile_limit == limit  # raised for the bench alone
    assert [(row.batch, row.way) for row in r.rows] == [(b, w) for b in (1, 2) for w in WAYS]
    for row in r.rows:
        assert row.error is None and row.first_call_s is not None and row.first_call_s > 0
        assert row.prefill_tok_s is not None and row.prefill_tok_s.n == 2
        assert row.tokens == ("eager's two runs identical" if row.way == "eager" else "identical") and row.agrees
    steps = {row.way: row.steps for row in r.rows if row.batch == 1}
    assert "no CUDA device (cpu)" in steps["eager+forge"] and "static cache, torch.compile(forward" in steps["compile"]
    assert "backend=applied.backend()" not in steps["compile+forge"]  # nothing promoted: it is torch.compile
    assert any("nothing promoted" in n and "host-free decode step alone" in n for n in r.notes)
    # what Dynamo did in each compiled way's first call, as a row's counts and a note
    first = {row.way: row.compiled for row in r.rows if row.batch == 1 and row.way.startswith("compile")}
    assert first["compile"]["graphs"] >= 1 and first["compile"]["frames_compiled"] >= 1, first
    assert set(first["compile+forge"]) == set(first["compile"])  # nothing promoted: it may reuse compile's graphs
    # the one-token and N-token generations of a batch run the same shapes: no recompile is timed
    assert not any("while timed" in n for n in r.notes), r.notes
    assert not any(row.compiled for row in r.rows if not row.way.startswith("compile"))
    assert sum(n.startswith(("compile at batch 1: the first call compiled", "compile+forge at batch 1: the first call "
                             "compiled")) for n in r.notes) == 2, r.notes
    # batch-1 decode against the bandwidth limit: bytes a step reads over the copy bandwidth given
    bw = r.bandwidth
    assert bw["bandwidth_Bps"] == 1e10 and bw["kv_length"] == 16 + 2
    assert bw["limit_tok_s"] == pytest.approx(1e10 / (bw["weight_bytes"] + bw["kv_bytes"]))
    ones = [row for row in r.rows if row.bandwidth_pct is not None]
    assert {row.batch for row in ones} == {1} and len(ones) == 4 - sum(row.decode_tok_s is None for row in ones)
    text = r.table()
    assert text.splitlines()[0].startswith("generate: tiny_decoder on cpu (float32), prompts of 16 tokens, 4 new")
    assert "of the bandwidth limit" in text and "TB/s measured copy bandwidth" in text
    j = r.to_json()
    assert json.loads(json.dumps(j))["rows"][0]["way"] == "eager" and j["runner"]["why_not_graphed"]
    assert not r.mismatches()


def test_the_embedding_lookup_reads_rows_and_the_experts_only_those_chosen():
    from forge_tui.examples import tiny_decoder, tiny_moe
    from forge_tui.generation import adapter_for

    dec = adapter_for(tiny_decoder.get_model())
    c = tiny_decoder.CONFIG
    params = sum(p.numel() for p in dec.model.parameters()) * 4
    assert dec.weight_bytes(1) == params - (c.vocab - 1) * c.hidden * 4  # one row of the table read
    moe = adapter_for(tiny_moe.get_model())
    m = tiny_moe.CONFIG
    experts = sum(p.numel() for layer in moe.model.layers for p in layer.mlp.experts.parameters()) * 4
    full = sum(p.numel() for p in moe.model.parameters()) * 4 - (m.vocab - 1) * m.hidden * 4
    assert moe.weight_bytes(1) == full - int(experts * (1 - m.top_k / m.experts))
    assert moe.weight_bytes(64) == full + 63 * m.hidden * 4  # every expert; 64 rows of the table
    assert dec.kv_bytes_per_token() == 2 * c.layers * c.kv_heads * c.head_dim * 4


def test_tokens_that_differ_are_judged_teacher_forced_against_the_model_in_fp32():
    """Along eager's tokens: a way whose model is eager's but whose tokens went another way (a near
    tie resolved otherwise) is as accurate as eager; a way whose model has a perturbed weight is
    less accurate (its logits off fp32's, its argmax off fp32's at clear positions); identical
    tokens say so and run no forward."""
    import copy

    from forge_tui.examples import tiny_decoder
    from forge_tui.generation import adapter_for, eager_generate
    from forge_tui.generation.bench import forced

    torch.manual_seed(0)
    model = tiny_decoder.get_model().eval()
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        perturbed.layers[0].mlp.down_proj.weight.add_(torch.randn_like(perturbed.layers[0].mlp.down_proj.weight))
    prompt = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    eager = eager_generate(model, prompt, 6)
    other = eager.clone()
    other[0, 3:] = (other[0, 3:] + 1) % 256  # another trajectory from step 4, the model eager's own
    worse = eager_generate(perturbed, prompt, 6)
    assert not torch.equal(worse, eager)
    models = {"eager": model, "eager+forge": model, "compile": copy.deepcopy(model), "compile+forge": perturbed}
    seq = torch.cat([prompt, eager], dim=1)
    asked: list[str] = []

    def logits(name):
        asked.append(name)
        with torch.no_grad():
            return adapter_for(models[name]).full_logits(seq)[:, :-1, :]

    def ref():
        with torch.no_grad():
            return adapter_for(copy.deepcopy(model).float()).full_logits(seq)[:, :-1, :]

    out = _judge({"eager": eager, "eager+forge": eager.clone(), "compile": other, "compile+forge": worse}, eager,
                 eager.clone(), logits, ref)
    assert out["eager"] == ("eager's two runs identical", True) and out["eager+forge"] == ("identical", True)
    assert "eager+forge" not in asked
    said, ok = out["compile"]
    assert ok and said.startswith("differ from step 4 in 1 of 2 rows; along eager's tokens as accurate as eager")
    said, ok = out["compile+forge"]
    assert not ok and "LESS accurate than eager" in said, said
    r = ref().float()  # eager is the fp32 model here: clear is a margin above the floor
    clear = forced(logits("compile+forge"), r, GAP_FLOOR * float(r.abs().max()))
    assert clear.agree < clear.clear and f"fp32's argmax at {clear.agree} of {clear.clear} clear" in said
    out = _judge({"eager": eager, "compile": other}, eager, torch.zeros_like(eager), logits, ref)
    assert out["eager"] == ("eager's two runs differ", True) and out["compile"][1]


def test_forge_bench_generate_prints_the_table(decoder_workspace, capsys):
    assert main(["bench", "example:tiny_decoder", "-w", str(decoder_workspace.root), "--generate", "3", "--batch", "1",
                 "--no-compile", "--device", "cpu", "--gen-repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("generate: tiny_decoder on cpu") and "eager+forge" in out and "compile" not in out.split("\n", 2)[2]
    assert main(["bench", "example:tiny_decoder", "-w", str(decoder_workspace.root), "--generate", "3", "--batch", "1",
                 "--no-compile", "--device", "cpu", "--gen-repeats", "1", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert [row["way"] for row in j["rows"]] == ["eager", "eager+forge"] and j["new_tokens"] == 3
    from forge_tui.generation_result import load

    assert load(decoder_workspace.root) == j  # the last run, kept for the app to show


@pytest.mark.parametrize("args, said", [
    (["--generate", "1"], "at least 2 new tokens"),
    (["--generate", "3", "--batch", "0"], "batch sizes must be positive"),
    (["--generate", "3", "--gen-repeats", "0"], "repeats must be at least 1"),
])
def test_bad_generate_requests_say_why(decoder_workspace, capsys, args, said):
    assert main(["bench", "example:tiny_decoder", "-w", str(decoder_workspace.root), "--device", "cpu", *args]) != 0
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_a_model_that_cannot_generate_is_refused(decoder_workspace):
    with pytest.raises(ForgeError, match="cannot generate"):
        generate_bench("example:tiny_mlp", decoder_workspace, 3, device="cpu")


@pytest.mark.timeout(280)
def test_the_generate_bench_script_on_a_given_workspace(decoder_workspace, tmp_path):
    """bench/generate_bench.py, as the device runs it, on the CPU: a workload in a process of its
    own, its JSON written to $OUT, the table printed last."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, OUT=str(tmp_path), FORGE_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(root / "bench" / "generate_bench.py"), "tiny_decoder", "--device", "cpu",
                          "--workspace", str(decoder_workspace.root), "--no-compile", "--repeats", "1", "--new-tokens",
                          "3", "--batch", "1", "--budget-s", "250"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=270)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "generate.json").read_text())
    w = report["workloads"]["tiny_decoder"]
    assert w.get("done"), w.get("error")
    rows = w["result"]["rows"]
    assert [r["way"] for r in rows] == ["eager", "eager+forge"] and rows[1]["tokens"] == "identical"
    assert w["result"]["prompt_len"] == 16 and w["result"]["new_tokens"] == 3 and "generate" in w["phases_s"]
    tail = run.stdout[run.stdout.rindex("=" * 100):]
    assert "generate: tiny_decoder on cpu" in tail and tail.rstrip().endswith("generate.json")


def test_a_way_that_fails_while_timed_loses_its_row_not_the_bench():
    """A compiled way can fail in the rounds after a first call that passed (a recompile limit
    reached with fullgraph=True): its row gets the error and the other ways are timed."""
    from forge_tui.generation.bench import WayResult, _rounds, _Way
    from forge_tui.timing import Timer

    calls = {"eager": 0, "compile": 0}

    def gen(name, fail_after=None):
        def g(ids, n):
            calls[name] += 1
            if fail_after is not None and calls[name] > fail_after:
                raise RuntimeError("Hard failure due to fullgraph=True\nmore")
            return ids
        return g

    ways = {"eager": _Way("eager", None, gen("eager"), lambda: ""), "compile": _Way("compile", None, gen("compile", 1), lambda: "")}
    rows = {n: WayResult(n, 1) for n in ways}
    raw = _rounds(Timer("cpu", warmup=0, repeats=2, cold_l2=False), ways, object(), 4, rows)
    assert set(raw) == {"eager|1", "eager|n"} and all(len(v) == 2 for v in raw.values())
    assert rows["compile"].error == "while timed: RuntimeError: Hard failure due to fullgraph=True"
    assert rows["eager"].error is None
    ways["eager"] = _Way("eager", None, gen("eager", 0), lambda: "")
    with pytest.raises(RuntimeError, match="fullgraph"):  # eager failing ends the bench
        _rounds(Timer("cpu", warmup=0, repeats=1, cold_l2=False), {"eager": ways["eager"]}, object(), 4, rows)
