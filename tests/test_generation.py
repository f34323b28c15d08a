"""Greedy generation (``forge_tui.generation``): the static KV cache against the growing one, the
runner's tokens against the model's own generation (forge's tiny examples and a tiny transformers
Llama, bare and with a workspace's kernels applied), its batch buckets and their fallback, and why a
decode step with a host sync is not captured. CUDA graphs are replaced by a stand-in capture that
records what it is asked to capture and replays by calling it (the CPU has no graphs)."""

from pathlib import Path

import pytest
import torch

from forge_tui.cli import main
from forge_tui.errors import ForgeError
from forge_tui.examples import tiny_decoder, tiny_moe
from forge_tui.examples._decoder_parts import init_random
from forge_tui.generation import GreedyRunner, adapter_for, eager_generate
from forge_tui.generation.cache import DynamicKV
from forge_tui.generation.graphs import host_syncs
from forge_tui.runtime.apply import apply
from forge_tui.workspace import profile_into_workspace

ROOT = Path(__file__).resolve().parent.parent
FORGE_TOML = "[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"
NEW = 8


class FakeCapture:
    """CUDA graph capture's stand-in: runs the warm-up calls, records the capture, and replays by
    calling the step (its effects are those of a replay: the step's buffers, written in place)."""

    def __init__(self, fail: str | None = None) -> None:
        self.captured = 0
        self.replays = 0
        self.warmups = 0
        self.fail = fail

    def capture(self, fn, warmup):
        for _ in range(warmup):
            fn()
            self.warmups += 1
        if self.fail:
            raise RuntimeError(self.fail)
        self.captured += 1

        def replay():
            self.replays += 1
            fn()

        return replay


def _model(example):
    """The example with weights spread wider than its 0.02: at 0.02 a tiny decoder's next token
    hangs on its last token alone (a step that forgot its position still made eager's tokens),
    at 0.1 on the cache's contents too."""
    torch.manual_seed(0)
    return init_random(example.get_model(), std=0.1).eval()


def _prompts(batch: int, vocab: int = 256, length: int = 16, seed: int = 3):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _llama():
    """The device bench's Llama workload, loaded as ``forge`` loads a workload file."""
    from forge_tui.workload import load_workload

    module = load_workload(ROOT / "bench" / "workloads" / "hf_llama_gen.py").module
    return module.get_model("cpu"), module


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    return _llama()


# ---- the caches ---------------------------------------------------------------------------------

def test_the_static_cache_holds_what_the_growing_cache_holds_and_the_prefill_is_the_full_forwards():
    m = _model(tiny_decoder)
    ad = adapter_for(m)
    ids = _prompts(2)
    static, dynamic = ad.static_cache(2, 32), DynamicKV(tiny_decoder.CONFIG.layers)
    with torch.no_grad():
        a, b = ad.prefill(ids, static), ad.prefill(ids, dynamic)
        # the cached path's last logits are the default forward's (which it leaves unchanged)
        torch.testing.assert_close(a, m(ids)[0][:, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        nxt = a.argmax(-1, keepdim=True)
        for t in range(3):
            pos = torch.tensor([16 + t])
            a, b = ad.decode(nxt, pos, static), ad.decode(nxt, pos, dynamic)
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
            nxt = a.argmax(-1, keepdim=True)
    assert dynamic.length() == 19
    for layer in range(tiny_decoder.CONFIG.layers):
        for got, want in ((static.keys[layer], dynamic.keys[layer]), (static.values[layer], dynamic.values[layer])):
            # the prompt's slots bit for bit; the steps' within rounding (attention sums over more
            # slots in the static cache, the masked ones adding exact zeros in another order)
            torch.testing.assert_close(got[:, :, :16], want[:, :, :16], rtol=0, atol=0)
            torch.testing.assert_close(got[:, :, 16:19], want[:, :, 16:], rtol=1e-5, atol=1e-6)
            assert not got[:, :, 19:].any()  # nothing written past the last position


def test_a_static_cache_slot_after_the_position_is_never_attended_to():
    """Stale keys in the slots after a step's position (from a longer generation before) change
    nothing: the mask hides every slot past the position."""
    m = _model(tiny_decoder)
    ad = adapter_for(m)
    ids = _prompts(1)
    cache = ad.static_cache(1, 32)
    with torch.no_grad():
        clean = ad.prefill(ids, cache)
        for t in cache.keys + cache.values:
            t[:, :, 16:].normal_()
        torch.testing.assert_close(ad.decode(clean.argmax(-1, keepdim=True), torch.tensor([16]), cache),
                                   ad.decode(clean.argmax(-1, keepdim=True), torch.tensor([16]), _prefilled(ad, ids)),
                                   rtol=0, atol=0)


def _prefilled(ad, ids):
    cache = ad.static_cache(ids.shape[0], 32)
    ad.prefill(ids, cache)
    return cache


# ---- tokens against the model's own generation ----------------------------------------------------

@pytest.mark.parametrize("example", [tiny_decoder, tiny_moe], ids=["tiny_decoder", "tiny_moe"])
def test_runner_tokens_are_the_examples_own_greedy_tokens(example):
    m = _model(example)
    ids = _prompts(2)
    eager = example.generate(m, [ids], NEW)
    assert eager.shape == (2, NEW) and len(set(eager[0].tolist())) > 1  # tokens that vary: a real check
    runner = GreedyRunner(adapter_for(m), max_len=32, capture=None)
    assert torch.equal(runner.generate(ids, NEW).tokens, eager)
    assert torch.equal(runner.generate(ids[:1], NEW).tokens, eager[:1])
    with torch.no_grad():
        assert torch.equal(adapter_for(m).static_generate(ids, NEW), eager)


def test_runner_tokens_are_transformers_generate_tokens(llama):
    model, wl = llama
    ids = wl.get_inputs("cpu")[0]
    eager = wl.generate(model, [ids], NEW)
    with torch.no_grad():
        hf = model.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert torch.equal(eager, hf[:, ids.shape[1]:]) and len(set(eager[0].tolist())) > 1
    fake = FakeCapture()
    runner = GreedyRunner(adapter_for(model), max_len=32, capture=fake)
    got = runner.generate(ids, NEW)
    assert got.graphed and got.prefill_graphed and fake.captured == 2 and torch.equal(got.tokens, eager)  # prefill, step
    assert runner.status().why_not_graphed is None and runner.status().why_no_prefill_graph is None
    with torch.no_grad():  # the static cache through generate() itself (the torch.compile way's loop)
        assert torch.equal(adapter_for(model).static_generate(ids, NEW), eager)
        assert torch.equal(adapter_for(model).static_generate(ids, NEW, max_len=40), eager)  # a cache passed in


# ---- with a workspace's kernels applied --------------------------------------------------------------

@pytest.fixture(scope="module")
def moe_experts_ws(tmp_path_factory):
    """tiny_moe with its experts cards promoted (every card that matches, whatever its time)."""
    root = tmp_path_factory.mktemp("gen-moe")
    cfg = root / "forge.toml"
    cfg.write_text(FORGE_TOML)
    ws, _ = profile_into_workspace("example:tiny_moe", root / "ws", device="cpu", config_path=cfg)
    assert main(["experts", "example:tiny_moe", "-w", str(ws.root), "--device", "cpu", "--repeats", "3",
                 "--min-speedup", "0"]) == 0
    return ws


def test_a_step_with_a_host_sync_says_why_and_runs_op_by_op():
    m = _model(tiny_moe)
    fake = FakeCapture()
    runner = GreedyRunner(adapter_for(m), max_len=32, capture=fake)
    got = runner.generate(_prompts(2), NEW)
    why = runner.status().why_not_graphed
    # the first read back in the block's routing (one_hot checks its indices on the host, then nonzero)
    assert why and why.startswith("the decode step aten.") and "in SparseMoE.forward (_decoder_parts.py:" in why, why
    assert not got.graphed and fake.captured == 0 and fake.warmups == 0  # the scan ran before any capture
    assert runner.status().op_by_op == {why: NEW - 1}
    pwhy = runner.status().why_no_prefill_graph  # the prefill routes its tokens alike
    assert pwhy and pwhy.startswith("the prefill aten.") and "in SparseMoE.forward" in pwhy, pwhy
    assert not got.prefill_graphed and runner.status().prefill_op_by_op == {pwhy: 1}
    assert torch.equal(got.tokens, tiny_moe.generate(m, [_prompts(2)], NEW))


def test_host_syncs_sees_reads_back_and_nothing_in_a_plain_step():
    x = torch.arange(6.0)
    assert "aten._local_scalar_dense" in host_syncs(lambda: x.sum().item())
    assert "aten.nonzero" in host_syncs(lambda: (x > 2).nonzero())
    assert host_syncs(lambda: (x * 2).argmax()) is None


def test_experts_applied_make_the_moe_step_capturable_with_eagers_tokens(moe_experts_ws):
    m = _model(tiny_moe)
    ids = _prompts(2)
    eager = tiny_moe.generate(m, [ids], NEW)
    with apply(m, moe_experts_ws, mode="inference", device="cpu", only_faster=False) as applied:
        fake = FakeCapture()
        runner = GreedyRunner(adapter_for(m), max_len=32, capture=fake)
        got = runner.generate(ids, NEW)
        served = {c["card"]: c["served"] for c in applied.status()["cards"] if c["kind"] == "experts"}
    assert runner.status().why_not_graphed is None and got.graphed and got.prefill_graphed and fake.captured == 2
    assert served and all(n > 0 for n in served.values()), served
    assert torch.equal(got.tokens, eager)


@pytest.fixture(scope="module")
def decoder_merge_ws(tmp_path_factory):
    """tiny_decoder with its merge cards promoted (k/v and gate/up: every card that matches)."""
    root = tmp_path_factory.mktemp("gen-dec")
    cfg = root / "forge.toml"
    cfg.write_text(FORGE_TOML)
    ws, _ = profile_into_workspace("example:tiny_decoder", root / "ws", device="cpu", config_path=cfg)
    assert main(["merge", "example:tiny_decoder", "-w", str(ws.root), "--device", "cpu", "--repeats", "3",
                 "--min-speedup", "0"]) == 0
    return ws


def test_decoder_tokens_with_merged_linears_applied_are_eagers(decoder_merge_ws):
    m = _model(tiny_decoder)
    ids = _prompts(2)
    eager = tiny_decoder.generate(m, [ids], NEW)
    # every promoted card used, whatever this machine timed it at: the test is about its tokens
    with apply(m, decoder_merge_ws, mode="inference", device="cpu", only_faster=False) as applied:
        runner = GreedyRunner(adapter_for(m), max_len=32, capture=FakeCapture())
        got = runner.generate(ids, NEW)
        served = sum(c["served"] for c in applied.status()["cards"] if c["kind"] == "merge")
    assert served > 0 and got.graphed
    assert torch.equal(got.tokens, eager)


# ---- buckets ----------------------------------------------------------------------------------------

def test_batches_run_in_their_bucket_padded_and_above_every_bucket_op_by_op():
    m = _model(tiny_decoder)
    fake = FakeCapture()
    runner = GreedyRunner(adapter_for(m), max_len=32, buckets=(1, 4), capture=fake, warmup=2)
    ids = _prompts(5)
    for batch in (1, 3, 4):
        got = runner.generate(ids[:batch], NEW)
        assert got.graphed and got.bucket == (1 if batch == 1 else 4) and got.tokens.shape == (batch, NEW)
        assert torch.equal(got.tokens, eager_generate(m, ids[:batch], NEW))
    # once per bucket, its prefill and its step, each with one warm-up on the capture's stream
    assert fake.captured == 4 and fake.warmups == 4
    big = runner.generate(ids, NEW)  # 5: above every bucket
    assert not big.graphed and big.bucket is None and torch.equal(big.tokens, eager_generate(m, ids, NEW))
    st = runner.status()
    assert st.graphs == {1: NEW - 1, 4: 2 * (NEW - 1)} and fake.replays == 3 * (NEW - 1) + 3  # and 3 prefills
    assert st.op_by_op == {"batch 5 above every bucket (1, 4)": NEW - 1}
    assert st.prefill_graphs == {"1x16": 1, "4x16": 2} and st.prefill_op_by_op == {"batch 5 above every bucket (1, 4)": 1}
    assert st.generations["graph, bucket 4"] == 2 and st.why_not_graphed is None
    assert "batch 5 above every bucket" in st.line() and st.to_json()["graphs"] == {"1": NEW - 1, "4": 2 * (NEW - 1)}


def test_prefills_padded_to_their_length_make_eagers_tokens_from_one_graph_per_length(llama):
    """A prompt is padded on the right to the smallest captured length that holds it (never past
    the cache's slots): its tokens are eager's, a later prompt of another length padded alike
    replays the same graph, and a prompt longer than every length runs its prefill op by op."""
    model, wl = llama
    for ad, ids in ((adapter_for(_model(tiny_decoder)), _prompts(2, length=16)), (adapter_for(model), wl.get_inputs("cpu")[0])):
        fake = FakeCapture()
        runner = GreedyRunner(ad, max_len=32, lengths=(8, 16), capture=fake)
        for n in (13, 16, 9, 5):
            got = runner.generate(ids[:, :n], NEW)
            assert got.prefill_graphed and torch.equal(got.tokens, eager_generate(ad.model, ids[:, :n], NEW)), n
        st = runner.status()
        assert fake.captured == 3 and st.prefill_graphs == {"2x16": 3, "2x8": 1}, st  # 16, 8 and the step
        assert "prefills from CUDA graphs: 2x16 x3, 2x8 x1" in st.line()
        # a cache of 14 slots holds 13 tokens and one new one: that prompt is padded to 14, not 16
        short = GreedyRunner(ad, max_len=14, lengths=(16,), capture=FakeCapture())
        got = short.generate(ids[:, :12], 2)
        assert short.status().prefill_graphs == {"2x14": 1} and torch.equal(got.tokens, eager_generate(ad.model, ids[:, :12], 2))
    long = runner.generate(ids, 4)  # the Llama's 16 tokens and lengths of 8 and 16: held; 17 is not
    assert long.prefill_graphed
    over = GreedyRunner(adapter_for(model), max_len=32, lengths=(8,), capture=FakeCapture())
    got = over.generate(ids, 4)
    assert got.graphed and not got.prefill_graphed and torch.equal(got.tokens, eager_generate(model, ids, 4))
    assert over.status().prefill_op_by_op == {"a prompt of 16 tokens above every length (8)": 1}


def test_a_capture_that_fails_says_why_and_every_step_runs_op_by_op():
    m = _model(tiny_decoder)
    runner = GreedyRunner(adapter_for(m), max_len=32, buckets=(2,), capture=FakeCapture(fail="operation not permitted"))
    got = runner.generate(_prompts(2), NEW)
    why = runner.status().why_not_graphed
    assert why == "the capture failed: RuntimeError: operation not permitted"
    assert runner.status().why_no_prefill_graph == "the prefill's capture failed: RuntimeError: operation not permitted"
    assert not got.prefill_graphed
    assert not got.graphed and torch.equal(got.tokens, eager_generate(m, _prompts(2), NEW))
    assert not runner.generate(_prompts(2), NEW).graphed  # and it is not tried again


def test_no_cuda_device_means_op_by_op_with_that_reason():
    runner = GreedyRunner(adapter_for(_model(tiny_decoder)), max_len=32)
    runner.generate(_prompts(1), 3)
    assert runner.status().why_not_graphed == "no CUDA device (cpu): CUDA graphs need one"


def test_eos_ends_sequences_and_a_check_every_k_steps_stops_early():
    m = _model(tiny_decoder)
    ids = _prompts(2)
    eager = eager_generate(m, ids, 12)
    eos = int(eager[0, 2])  # row 0 makes it at its third token
    runner = GreedyRunner(adapter_for(m), max_len=40, capture=FakeCapture(), eos_token_id=eos, pad_token_id=-1,
                          sync_every=4)
    got = runner.generate(ids, 12).tokens
    for row in range(2):
        hits = (eager[row] == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else got.shape[1]
        assert torch.equal(got[row, :end], eager[row, :end]) and (got[row, end:] == -1).all()
    # one sequence whose first token is eos: the check after step 2 sees every sequence ended
    first = GreedyRunner(adapter_for(m), max_len=40, capture=None, eos_token_id=int(eager[0, 0]), sync_every=2)
    stopped = first.generate(ids[:1], 12).tokens
    assert stopped.shape == (1, 3) and int(stopped[0, 0]) == int(eager[0, 0])
    assert first.status().op_by_op[first.status().why_not_graphed] == 2


def test_bad_requests_are_refused_with_their_cause():
    runner = GreedyRunner(adapter_for(_model(tiny_decoder)), max_len=20, capture=None)
    with pytest.raises(ForgeError, match="exceed the cache's 20 slots"):
        runner.generate(_prompts(1), 5)
    with pytest.raises(ForgeError, match="prompts must be"):
        runner.generate(torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ForgeError, match="buckets"):
        GreedyRunner(adapter_for(_model(tiny_decoder)), max_len=20, buckets=(0,))
    with pytest.raises(ForgeError, match="cannot generate"):
        adapter_for(torch.nn.Linear(2, 2))


def test_first_call_checks_run_in_the_warm_up_before_the_scan():
    """A step that reads the device back on its first call only (forge's first-call checks, a
    compile) is captured: the warm-up steps run it before the scan for host syncs."""
    from forge_tui.generation import ExampleAdapter

    class FirstCallCheck(ExampleAdapter):
        calls = 0

        def decode(self, ids, pos, cache):
            out = super().decode(ids, pos, cache)
            FirstCallCheck.calls += 1
            if FirstCallCheck.calls == 1:
                float(out.sum())  # read back once
            return out

    m = _model(tiny_decoder)
    runner = GreedyRunner(FirstCallCheck(m), max_len=32, capture=FakeCapture(), warmup=1)
    assert runner.generate(_prompts(1), 4).graphed and runner.status().why_not_graphed is None
    FirstCallCheck.calls = 0
    cold = GreedyRunner(FirstCallCheck(m), max_len=32, capture=FakeCapture(), warmup=0)
    assert not cold.generate(_prompts(1), 4).graphed
    assert "aten._local_scalar_dense in test_first_call_checks" in cold.status().why_not_graphed


def test_the_generate_bench_with_experts_served_names_them_and_agrees(moe_experts_ws):
    from forge_tui.generation.bench import generate_bench

    # every promoted card used, whatever a loaded machine times it at: the test is about what is served
    r = generate_bench("example:tiny_moe", moe_experts_ws, 3, batches=(2,), device="cpu", repeats=1,
                       with_compile=False, only_faster=False)
    assert [(row.way, row.tokens) for row in r.rows] == [("eager", "eager's two runs identical"),
                                                          ("eager+forge", "identical")]
    served = {k: v for k, v in r.runner["served"].items() if v}
    assert served and all(k.startswith("eager+forge: experts-") for k in served), r.runner
    assert "forge served: eager+forge: experts-" in r.table() and not any("nothing promoted" in n for n in r.notes)


def test_the_bench_names_each_compiled_cards_ratio_over_torch_compiles_own_code(moe_experts_ws, tmp_path):
    """torch.compile + forge's notes give each card it serves with the isolated ratio its evidence
    holds over torch.compile's own code for it (``forge experts`` times the compiled block on cuda),
    or that none was measured."""
    import shutil

    from forge_tui.generation.bench import _vs_compile
    from forge_tui.promotion import manifest
    from forge_tui.runtime.manifest import Manifest

    (card,) = [c for c, e in manifest(moe_experts_ws).entries.items() if e.signature.kind == "experts"]
    assert _vs_compile(moe_experts_ws, [card]) == [
        f"compile+forge: {card}: its ratio over torch.compile's own code for it was not measured"]
    shutil.copytree(moe_experts_ws.root, tmp_path / "ws", symlinks=True)
    folder = tmp_path / "ws" / "kernels"
    man = Manifest.load(folder)
    e = man.entries[card]
    man.entries[card] = e.model_copy(update={"evidence": e.evidence.model_copy(
        update={"speedup_vs_compile": 1.3, "compile_basis": "latency"})})
    man.save(folder)
    assert _vs_compile(tmp_path / "ws", [card]) == [
        f"compile+forge: {card}: 1.30x torch.compile's own code for it alone (call latency)"]


def test_warm_up_and_capture_fit_a_cache_with_room_for_the_tokens_asked_alone(llama):
    """A bucket's first generation warms its step up and captures it before generating: those
    steps write the slot after the prompt again and again, never past the cache's end (a
    transformers cache keeps its own write position), and a one-token generation captures nothing."""
    model, wl = llama
    for ad, ids in ((adapter_for(_model(tiny_decoder)), _prompts(2)), (adapter_for(model), wl.get_inputs("cpu")[0])):
        fake = FakeCapture()
        runner = GreedyRunner(ad, max_len=ids.shape[1] + 2, capture=fake, warmup=3)
        assert runner.generate(ids, 1).tokens.shape == (2, 1) and fake.captured == 0
        got = runner.generate(ids, 2)
        assert got.graphed and fake.captured == 2 and torch.equal(got.tokens, eager_generate(ad.model, ids, 2))
