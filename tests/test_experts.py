"""Routed mixture-of-experts blocks in one grouped pass (``forge experts``, ``runtime/experts.py``):
which modules are such blocks (read from their structure and one expert's output), the grouped
pass against the block's own forward, the promotion, the guarded serving with its stacked weights
and their undo, the fallbacks, the first-call check, torch.compile, the bench's units and bound,
the command's refusals, export."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge_tui.cli import main
from forge_tui.e2e.bounds import config_shares
from forge_tui.e2e.bounds import isolation_bound as _bound
from forge_tui.e2e.switch_off import switch_off_units
from forge_tui.examples import tiny_moe
from forge_tui.examples._decoder_parts import SparseMoE, init_random
from forge_tui.promotion import kernels_dir, manifest
from forge_tui.rewrites import experts as experts_workspace_mod
from forge_tui.runtime import experts as experts_mod
from forge_tui.runtime.apply import Mode, apply
from forge_tui.runtime.experts import Stacked, check, find_blocks, routed
from forge_tui.runtime.export import export
from forge_tui.runtime.status import StatusBoard
from forge_tui.workspace import profile_into_workspace

BLOCKS = ("layers.0.mlp", "layers.1.mlp")
"""tiny_moe's routed-experts blocks: one a decoder layer, two layers."""

FORGE_TOML = "[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"


def _model():
    torch.manual_seed(0)
    return tiny_moe.get_model().eval()


def _hidden(seed: int = 1, dtype=torch.float32):
    """Hidden states for one block: [batch, seq, hidden] as tiny_moe's layers give it."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, 64, generator=g).to(dtype)


def _own(block, x):
    """The block's own forward (the class's, whatever the instance's forward was replaced by)."""
    return type(block).forward(block, x)


@pytest.fixture(scope="module")
def moe_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    cfg = root / "forge.toml"
    cfg.write_text(FORGE_TOML)
    ws, _ = profile_into_workspace("example:tiny_moe", root / "ws", device="cpu", config_path=cfg)
    # every card that matches, however this machine's load timed it
    assert main(["experts", "example:tiny_moe", "-w", str(ws.root), "--device", "cpu", "--repeats", "5",
                 "--min-speedup", "0"]) == 0
    # recorded as faster than eager, whatever a loaded machine timed: which cards apply serves by
    # default (``only_faster``) must not depend on it (three busy processes once timed 0.75x)
    path = ws.root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["evidence"]["speedup_vs_eager"] = 2.0
    path.write_text(json.dumps(data))
    return ws


def _experts_cards(man) -> list[str]:
    return sorted(c for c, e in man.entries.items() if e.signature.kind == "experts")


def _status(applied) -> dict:
    cards = [c for c in applied.status()["cards"] if c["kind"] == "experts"]
    assert len(cards) == 1
    return cards[0]


# look-alikes: a gate and experts, but not the block the grouped pass computes

class _Expert(nn.Module):
    """down(act(gate(x)) * up(x)), Llama-style names."""

    def __init__(self, hidden=16, inter=8, act=F.silu):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _WithSharedExpert(nn.Module):
    """A shared expert beside the routed ones but no gate for it (a child with weights)."""

    def __init__(self):
        super().__init__()
        self.top_k = 2
        self.gate = nn.Linear(16, 4, bias=False)
        self.experts = nn.ModuleList(_Expert() for _ in range(4))
        self.shared_expert = nn.Linear(16, 16, bias=False)


class _TanhExperts(nn.Module):
    """Experts whose activation is none the grouped pass knows."""

    def __init__(self):
        super().__init__()
        self.top_k = 2
        self.gate = nn.Linear(16, 4, bias=False)
        self.experts = nn.ModuleList(_Expert(act=torch.tanh) for _ in range(4))


class _FusedExperts(nn.Module):
    """transformers 5's layout: every expert's weights in [experts, rows, cols] parameters."""

    def __init__(self):
        super().__init__()
        self.top_k = 2
        self.gate = nn.Linear(16, 4, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.randn(4, 16, 16))
        self.experts.down_proj = nn.Parameter(torch.randn(4, 16, 8))


class _MixtralExpert(nn.Module):
    def __init__(self, hidden=16, inter=8):
        super().__init__()
        self.w1 = nn.Linear(hidden, inter, bias=False)
        self.w3 = nn.Linear(hidden, inter, bias=False)
        self.w2 = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)) * self.w3(x))


class _Mixtral(nn.Module):
    """Mixtral's eager block: w1/w3/w2 experts, ``num_experts_per_tok``, renormalised top-k
    weights, and the router logits returned beside the output."""

    def __init__(self, hidden=16, experts=4):
        super().__init__()
        self.num_experts_per_tok = 2
        self.num_experts = experts
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(_MixtralExpert(hidden) for _ in range(experts))

    def forward(self, hidden_states):
        bsz, seq, hidden = hidden_states.shape
        h = hidden_states.view(-1, hidden)
        logits = self.gate(h)
        w = F.softmax(logits, dim=1, dtype=torch.float)
        w, selected = torch.topk(w, self.num_experts_per_tok, dim=-1)
        w /= w.sum(dim=-1, keepdim=True)
        w = w.to(h.dtype)
        final = torch.zeros_like(h)
        mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(mask[e])
            out = self.experts[e](h[top_x]) * w[top_x, idx, None]
            final.index_add_(0, top_x, out.to(h.dtype))
        return final.reshape(bsz, seq, hidden), logits


def test_blocks_are_found_by_structure_and_look_alikes_say_why_not():
    blocks, why = find_blocks(_model())
    assert not why
    assert [b.path for b in blocks] == list(BLOCKS)
    for b in blocks:
        assert (b.act, b.top_k, b.experts, b.hidden, b.intermediate) == ("silu", 2, 8, 64, 32)
        assert b.names == ("gate_proj", "up_proj", "down_proj")
    torch.manual_seed(0)
    blocks, why = find_blocks(_WithSharedExpert())
    assert blocks == [] and "children besides the router" in why[""] and "shared_expert" in why[""]
    blocks, why = find_blocks(_TanhExperts())
    assert blocks == [] and "not down(act(gate(x)) * up(x))" in why[""]
    blocks, why = find_blocks(_FusedExperts())
    assert blocks == [] and "stored fused" in why[""]
    blocks, why = find_blocks(_Mixtral())
    assert not why and len(blocks) == 1
    assert (blocks[0].names, blocks[0].act, blocks[0].top_k) == (("w1", "w3", "w2"), "gelu", 2)


class _Qwen2Moe(nn.Module):
    """Qwen2-MoE's block as transformers 4.x writes it: routed experts without renormalising their
    top-k weights, plus a shared expert scaled by a sigmoid gate, returning the router logits."""

    def __init__(self, hidden=64, inter=32, experts=8, top_k=4):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = experts, top_k, False
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(_Expert(hidden, inter) for _ in range(experts))
        self.shared_expert = _Expert(hidden, 2 * inter)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, hidden_states):
        bsz, seq, hidden = hidden_states.shape
        h = hidden_states.view(-1, hidden)
        logits = (self.gate if "gate" in self._modules else self.router)(h)
        w = F.softmax(logits, dim=1, dtype=torch.float)
        w, selected = torch.topk(w, self.top_k, dim=-1)
        w = w.to(h.dtype)
        final = torch.zeros_like(h)
        mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(mask[e])
            out = self.experts[e](h[None, top_x].reshape(-1, hidden)) * w[top_x, idx, None]
            final.index_add_(0, top_x, out.to(h.dtype))
        if "shared_expert" in self._modules:
            final = final + F.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
        return final.reshape(bsz, seq, hidden), logits


def test_a_shared_expert_with_its_gate_is_served_in_the_same_pass():
    torch.manual_seed(0)
    block = _Qwen2Moe().to(torch.bfloat16).eval()
    wrapper = nn.Module()
    wrapper.add_module("mlp", block)
    (b,), why = find_blocks(wrapper)
    assert not why and b.shared and b.norm is False and b.program(False, "tensor_logits")["shared"]
    x = _hidden(dtype=torch.bfloat16)
    with torch.no_grad():
        ref = block(x)
        stacked = Stacked(b, block, repoint=False)
        y = routed(x, block.gate.weight, stacked, b, False, True, block)
        assert torch.equal(y[0], ref[0]) and torch.equal(y[1], ref[1])
        # the same pass without the shared expert is another block
        alone = dataclasses.replace(b, shared=False)
        assert check(routed(x, block.gate.weight, stacked, alone, False, True, block), ref) is not None


class _Jamba(_Qwen2Moe):
    """Jamba's block as transformers 4.x writes it: its router linear is named router, no shared
    expert; its top-k weights are not renormalised, and it returns its router logits."""

    def __init__(self, hidden=64, inter=32, experts=8, top_k=2):
        nn.Module.__init__(self)
        self.num_experts, self.top_k = experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(_Expert(hidden, inter) for _ in range(experts))


def test_a_router_named_router_is_found_and_served():
    torch.manual_seed(0)
    block = _Jamba().to(torch.bfloat16).eval()
    wrapper = nn.Module()
    wrapper.add_module("feed_forward", block)
    (b,), why = find_blocks(wrapper)
    assert not why and b.router == "router" and b.program(False, "tensor_logits")["router"] == "router"
    x = _hidden(dtype=torch.bfloat16)
    with torch.no_grad():
        ref = block(x)
        y = routed(x, block.router.weight, Stacked(b, block, repoint=False), b, False, True, block)
        assert torch.equal(y[0], ref[0]) and torch.equal(y[1], ref[1])
        # served as the runtime serves it: the guard reads the router by its name
        board = StatusBoard(None)
        guard = experts_mod.ExpertsGuard("c", "t", b.program(False, "tensor_logits"), torch.bfloat16, "cpu", board, 0)
        stacked = Stacked(b, block, repoint=True)
        served = experts_mod.Served(guard, b, block, block.forward, stacked, list(block.modules()))
        out = served(x)
        stacked.release()
    assert torch.equal(out[0], ref[0]) and guard.status.served == 1 and guard.status.active


def test_quantized_experts_are_refused_and_a_failing_grouped_pass_is_a_refusal_not_a_crash(monkeypatch):
    model = _model()
    for p in model.layers[1].mlp.parameters():
        p.requires_grad_(False)
        p.data = p.data.to(torch.int8)
    blocks, why = find_blocks(model)
    assert [b.path for b in blocks] == ["layers.0.mlp"]
    assert why == {"layers.1.mlp": "its weights are int8 (quantized), not floating point"}

    def broken(*a, **k):
        raise RuntimeError("grouped_mm: no kernel for this dtype\nmore")

    monkeypatch.setattr(experts_workspace_mod, "routed", broken)
    model = _model()
    cards, _ = experts_workspace_mod.propose(model, tiny_moe.get_inputs(), lambda m, i: m(*i), "cpu", repeats=3)
    assert len(cards) == 1 and cards[0].speedup is None
    assert cards[0].refused == ("the grouped pass does not match the block on the captured input: it failed: "
                                "RuntimeError: grouped_mm: no kernel for this dtype")


def _bf16_block(top_k: int):
    """A tiny_moe block in bfloat16 (top-2), or one like it routing each token to ``top_k`` experts
    (three rows a token: the order they are added in rounds differently)."""
    if top_k == tiny_moe.CONFIG.top_k:
        block = _model().layers[0].mlp
    else:
        torch.manual_seed(0)
        block = init_random(SparseMoE(dataclasses.replace(tiny_moe.CONFIG, top_k=top_k))).eval()
    wrapper = nn.Module()
    wrapper.add_module("m", block.to(torch.bfloat16))
    (b,), _ = find_blocks(wrapper)
    return block, b


@pytest.mark.parametrize("top_k", [2, 3])
def test_the_grouped_pass_is_the_blocks_own_forward_bit_for_bit_in_bfloat16(top_k):
    block, b = _bf16_block(top_k)
    assert b.top_k == top_k
    x = _hidden(dtype=torch.bfloat16)
    with torch.no_grad():
        ref = block(x)
        stacked = Stacked(b, block, repoint=False)
        y = routed(x, block.gate.weight, stacked, b, True, False)
        assert torch.equal(y, ref)
        assert check(y, ref) is None
        # without renormalising the top-k weights it is another block
        unnormed = routed(x, block.gate.weight, stacked, b, False, False)
        assert check(unnormed, ref) is not None


def test_the_grouped_pass_returns_the_router_logits_where_the_block_does():
    torch.manual_seed(0)
    block = _Mixtral().eval()
    b = find_blocks(block)[0][0]
    x = _hidden()[..., :16].contiguous()
    with torch.no_grad():
        ref = block(x)
        y = routed(x, block.gate.weight, Stacked(b, block, repoint=False), b, True, True)
    assert isinstance(y, tuple) and len(y) == 2
    assert check(y, ref) is None
    assert torch.equal(y[1], ref[1])


def test_experts_promotes_cards_with_evidence(moe_ws):
    man = manifest(moe_ws)
    cards = _experts_cards(man)
    assert cards and len(man.entries) == len(cards)
    assert sorted(p for c in cards for p in man.entries[c].signature.module_paths) == list(BLOCKS)
    for card in cards:
        e = man.entries[card]
        assert card.startswith("experts-")
        assert e.evidence.input_sets == ["captured", "random"]
        assert e.evidence.speedup_vs_eager and e.approved_by
        assert e.signature.program["norm"] is True and e.signature.program["returns"] == "tensor"
        conf = kernels_dir(moe_ws) / card / "experts.json"
        assert conf.is_file() and (kernels_dir(moe_ws) / e.source) == conf
        data = json.loads(conf.read_text())
        assert data["blocks"] == e.signature.module_paths
        assert isinstance(data["share"], float) and 0 < data["share"] <= 1
    log = subprocess.run(["git", "-C", str(moe_ws.root), "log", "-1", "--format=%s%n%b", "main"],
                         capture_output=True, text=True, check=True).stdout
    assert "routed-experts card" in log and "Forge-Event: approve" in log


def test_a_served_model_matches_eager_on_stacked_weights_and_undo_unstacks_them(moe_ws):
    eager, model = _model(), _model()
    x = tiny_moe.get_inputs()[0]
    before = {id(p): p for p in model.parameters()}
    with torch.no_grad():
        ref = eager(x)
        with apply(model, moe_ws, trial_calls=0) as applied:
            assert sorted(applied.experts) == _experts_cards(manifest(moe_ws))
            y = model(x)
            st = _status(applied)
            assert st["served"] == len(BLOCKS) and st["active"] and not st["fallbacks"]
            model(x)
            assert _status(applied)["served"] == 2 * len(BLOCKS)
            assert sorted(_status(applied)["sites"]) == list(BLOCKS)
            for path in BLOCKS:
                experts = model.get_submodule(path).experts
                assert "forward" in model.get_submodule(path).__dict__
                for name in ("gate_proj", "up_proj", "down_proj"):
                    ptrs = {e.get_submodule(name).weight.untyped_storage().data_ptr() for e in experts}
                    assert len(ptrs) == 1, name  # one stacked tensor, each expert's weight a view
                assert (experts[0].gate_proj.weight.untyped_storage().data_ptr()
                        == experts[0].up_proj.weight.untyped_storage().data_ptr())  # gate and up stacked together
        for path in BLOCKS:
            assert "forward" not in model.get_submodule(path).__dict__  # undone
    torch.testing.assert_close(y, ref)
    # the same Parameter objects, each with its own storage again, the values unchanged
    assert {id(p): p for p in model.parameters()}.keys() == before.keys()
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages)
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        assert torch.equal(p, q), name
        assert p.is_contiguous() and p.storage_offset() == 0, name


def test_the_grouped_pass_falls_back_where_it_would_not_compute_what_the_block_does(moe_ws):
    model = _model()
    block = model.layers[0].mlp
    x = _hidden()
    with apply(model, moe_ws, trial_calls=0) as applied:
        with torch.no_grad():
            block(x)  # the first call: checked and served
        served = _status(applied)["served"]
        # gradients: the block's own forward, and the backward works
        y = block(x)
        assert y.requires_grad
        y.sum().backward()
        assert block.gate.weight.grad is not None
        assert _status(applied)["fallbacks"] == {"gradients are needed": 1}
        with torch.no_grad():
            torch.testing.assert_close(y, _own(block, x), rtol=0, atol=0)
            # the block in training mode
            block.train()
            torch.testing.assert_close(block(x), _own(block, x), rtol=0, atol=0)
            block.eval()
            assert _status(applied)["fallbacks"].get("the block is in training mode") == 1
            # hidden states of another rank: the block's own forward, which refuses them
            with pytest.raises(ValueError):
                block(x[0])
            assert _status(applied)["fallbacks"].get("2 dims where the card's calls had 3") == 1
            # a forward hook on one expert sees the expert's own calls
            seen = []
            h = block.experts[3].register_forward_hook(lambda m, i, o: seen.append(o))
            out = block(x)
            h.remove()
            torch.testing.assert_close(out, _own(block, x), rtol=0, atol=0)
            assert seen and _status(applied)["fallbacks"].get("forward hooks on the block or its children") == 1
            # an expert's weight given other storage (param.data = ...)
            w = block.experts[2].gate_proj.weight
            w.data = w.data * 3
            torch.testing.assert_close(block(x), _own(block, x), rtol=0, atol=0)
            assert _status(applied)["fallbacks"].get("an expert's weight was replaced since the install") == 1
            # another dtype (the block's weights converted too: each its own storage again)
            block.double()
            torch.testing.assert_close(block(x.double()), _own(block, x.double()), rtol=0, atol=0)
            assert _status(applied)["fallbacks"].get("dtype float64") == 1
        assert _status(applied)["served"] == served  # none of these served
        assert _status(applied)["active"]


def test_an_expert_weight_replaced_by_a_new_parameter_falls_back(moe_ws):
    model = _model()
    block = model.layers[0].mlp
    x = _hidden()
    with torch.no_grad(), apply(model, moe_ws, trial_calls=0) as applied:
        block(x)
        w = block.experts[2].gate_proj.weight
        block.experts[2].gate_proj.weight = nn.Parameter(w.clone() * 3)
        out = block(x)
        torch.testing.assert_close(out, _own(block, x), rtol=0, atol=0)  # not the stale stacked weight's
        assert _status(applied)["fallbacks"].get("an expert's weight was replaced since the install") == 1


def test_a_grouped_pass_error_disables_the_card_and_returns_the_blocks_own_output(moe_ws, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(experts_mod, "routed", boom)
    eager, model = _model(), _model()
    x = tiny_moe.get_inputs()[0]
    with torch.no_grad(), apply(model, moe_ws, trial_calls=0) as applied:
        y = model(x)
        st = _status(applied)
        assert not st["active"] and "grouped pass error" in st["disabled_reason"] and "boom" in st["disabled_reason"]
        assert st["served"] == 0
        assert st["fallbacks"] == {"grouped pass error": 1, "disabled": len(BLOCKS) - 1}
        torch.testing.assert_close(y, eager(x), rtol=0, atol=0)


def test_a_grouped_pass_that_does_not_match_is_disabled_at_its_first_call(moe_ws, monkeypatch):
    monkeypatch.setattr(experts_mod, "routed", lambda x, *a, **k: torch.zeros_like(x))
    eager, model = _model(), _model()
    x = tiny_moe.get_inputs()[0]
    with torch.no_grad(), apply(model, moe_ws, trial_calls=0) as applied:
        y = model(x)
        st = _status(applied)
        assert not st["active"] and "first-call check" in st["disabled_reason"]
        assert st["served"] == 0 and st["fallbacks"].get("check mismatch") == 1
        torch.testing.assert_close(y, eager(x), rtol=0, atol=0)


def test_experts_cards_are_units_of_their_own_with_their_share_in_the_bound(moe_ws):
    man = manifest(moe_ws)
    cards = _experts_cards(man)
    assert switch_off_units(man, cards) == [[c] for c in cards]
    # never merged with the op cards intercepted in its blocks (in memory only: an op card there)
    op = man.entries[cards[0]].model_copy(deep=True)
    op.card, op.signature.kind = "op-in-the-block", "op"
    man.entries[op.card] = op
    assert switch_off_units(man, [op.card, *cards]) == [[op.card]] + [[c] for c in cards]
    del man.entries[op.card]
    served = {c: 1 for c in cards}
    shares = config_shares(moe_ws, man, served)
    want = {c: json.loads((kernels_dir(moe_ws) / man.entries[c].source).read_text())["share"] for c in cards}
    assert shares == pytest.approx(want) and all(s > 0 for s in shares.values())
    assert config_shares(moe_ws, man, {}) == {}
    saved = sum(shares[c] * (1 - 1 / man.entries[c].evidence.speedup_vs_eager) for c in cards)
    bound = _bound(moe_ws, man, served)
    if 0 < saved < 1:  # (a card promoted at --min-speedup 0 may have timed slower here: no bound then)
        assert bound == pytest.approx(1 / (1 - saved))
    else:
        assert bound is None


def test_experts_are_served_in_a_torch_compiled_model(moe_ws):
    eager, model = _model(), _model()
    x = tiny_moe.get_inputs()[0]
    torch._dynamo.reset()
    try:
        with torch.no_grad(), apply(model, moe_ws, mode=Mode.TORCH_COMPILE) as applied:
            assert sorted(applied.experts) == _experts_cards(manifest(moe_ws))
            y = torch.compile(model, backend="eager")(x)
            torch.testing.assert_close(y, eager(x))
            assert _status(applied)["served"] == len(BLOCKS)
    finally:
        torch._dynamo.reset()


def test_torch_compiles_block_is_timed_beside_the_grouped_pass_and_kept_as_evidence(moe_ws, tmp_path, monkeypatch):
    """Asked (on cuda by default), each experts card is timed against torch.compile's code for its
    block too, interleaved with the block's forward and the grouped pass: its paired ratio is the
    card's isolated ratio over the compiler's own code, promoted as its evidence, which the runtime
    weighs the card by under torch.compile. A block that fails to compile leaves the ratio out and
    says why. (Dynamo's eager backend stands in for inductor here: the wiring is under test; every
    card that matches is kept, ``min_speedup=0``, however this machine's load timed it.)"""
    import shutil

    from forge_tui.rewrites.base import promote_cards
    from forge_tui.runtime.apply import _mode_why_not
    from forge_tui.workspace import Workspace

    real = torch.compile
    compiled_blocks = []

    def eager_compile(m, **kw):
        compiled_blocks.append(m)
        return real(m, backend="eager", **kw)

    monkeypatch.setattr(torch, "compile", eager_compile)
    model, x = _model(), tiny_moe.get_inputs()
    torch._dynamo.reset()
    try:
        plain, _ = experts_workspace_mod.propose(model, x, _forward, "cpu", repeats=3, min_speedup=0)
        assert not compiled_blocks and all(c.vs_compile is None and not c.compile_note for c in plain)
        cards, _ = experts_workspace_mod.propose(model, x, _forward, "cpu", repeats=3, min_speedup=0, vs_compile=True)
    finally:
        torch._dynamo.reset()
    (card,) = [c for c in cards if not c.refused]
    assert compiled_blocks and card.compiled is not None and card.vs_compile is not None
    assert card.compiled.n == card.grouped.n == card.eager.n == 3
    assert "torch.compile's block" in card.line() and card.to_json()["vs_compile"]["median"] == card.vs_compile.median
    shutil.copytree(moe_ws.root, tmp_path / "ws", symlinks=True)  # the module's workspace stays as it is
    (entry,) = promote_cards(Workspace.open(tmp_path / "ws"), [card], "Promote {n} routed-experts card{s}")
    assert manifest(Workspace.open(tmp_path / "ws")).entries[card.card].evidence == entry.evidence
    assert entry.evidence.speedup_vs_compile == card.vs_compile.median
    assert entry.evidence.compile_basis == "latency" and entry.evidence.compile_us == card.compiled.median
    slower = entry.model_copy(update={"evidence": entry.evidence.model_copy(
        update={"speedup_vs_eager": 2.0, "speedup_vs_compile": 0.8})})  # faster than eager, not the compiler
    assert "slower than torch.compile's own code for the card (0.800x)" in _mode_why_not(slower, Mode.TORCH_COMPILE, True)

    def failing(m, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", failing)
    cards, _ = experts_workspace_mod.propose(_model(), x, _forward, "cpu", repeats=3, min_speedup=0,
                                             vs_compile=True)
    (card,) = [c for c in cards if not c.refused]
    assert card.vs_compile is None and card.compile_note == "RuntimeError: no compiler here"
    assert "torch.compile's block not timed: RuntimeError: no compiler here" in card.line()


def _forward(model, inputs):
    return model(*inputs)


def test_experts_of_a_model_without_routed_experts_says_so(tmp_path, capsys):
    cfg = tmp_path / "forge.toml"
    cfg.write_text(FORGE_TOML)
    ws, _ = profile_into_workspace("example:tiny_mlp", tmp_path / "ws", device="cpu", config_path=cfg)
    assert main(["experts", "example:tiny_mlp", "-w", str(ws.root), "--device", "cpu"]) == 2
    assert "no routed mixture-of-experts block" in capsys.readouterr().err
    assert not manifest(ws).entries


def test_experts_promotes_by_the_threshold_asked(moe_ws, capsys):
    """No grouped pass is 1000x faster than its block; a negative threshold is refused with one
    line, and nothing changes."""
    assert main(["experts", "example:tiny_moe", "-w", str(moe_ws.root), "--device", "cpu", "--repeats", "3",
                 "--min-speedup", "1000", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: 0 experts cards would be promoted" in out and "below --min-speedup 1000" in out
    with moe_ws.git() as repo:
        before = repo.head()
    assert main(["experts", "example:tiny_moe", "-w", str(moe_ws.root), "--device", "cpu",
                 "--min-speedup", "-1"]) == 2
    assert "--min-speedup must be 0 or more" in capsys.readouterr().err
    with moe_ws.git() as repo:
        assert repo.head() == before


def test_an_export_serves_the_experts_in_a_fresh_process(moe_ws, tmp_path):
    out = export(kernels_dir(moe_ws), tmp_path / "export")
    code = (
        "import torch\n"
        "from forge_tui.examples import tiny_moe\n"
        "from forge_tui.runtime.apply import apply\n"
        "torch.manual_seed(0); m = tiny_moe.get_model().eval(); x = tiny_moe.get_inputs()[0]\n"
        "with torch.no_grad():\n"
        "    ref = m(x)\n"
        f"    with apply(m, {str(out)!r}, trial_calls=0) as a:\n"
        "        y = m(x)\n"
        "        print(sum(c['served'] for c in a.status()['cards'] if c['kind'] == 'experts'))\n"
        "torch.testing.assert_close(y, ref)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(len(BLOCKS))
