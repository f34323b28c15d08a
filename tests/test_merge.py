"""Sibling linears in one batched product (``forge merge``, ``runtime/merge.py``): which linears are
siblings (read from a run: one input object, unchanged, in every call), the product against the
separate linears, the promotion, the guarded serving with its stacked weights and their undo, the
stored outputs and what must hold to return one, the fallbacks, the first-call check,
torch.compile, the bench's units and shares, the command's refusals."""

import json
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge_tui.cli import main
from forge_tui.e2e.bounds import config_shares
from forge_tui.e2e.bounds import isolation_bound as _bound
from forge_tui.e2e.switch_off import switch_off_units
from forge_tui.promotion import kernels_dir, manifest
from forge_tui.rewrites.merge import find_siblings
from forge_tui.runtime import merge as merge_mod
from forge_tui.runtime.apply import Mode, apply
from forge_tui.runtime.merge import Stacked, merged, unmergeable
from forge_tui.workload import load_workload
from forge_tui.workspace import profile_into_workspace

FORGE_TOML = "[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"

WORKLOAD = '''
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """q/k/v on one input (with biases), then an output projection; ``poke``: the input is changed
    in place between the q and k projections (what no profiled call did)."""

    def __init__(self, d=32):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.to_out = nn.Linear(d, d)
        self.poke = False

    def forward(self, x):
        q = self.to_q(x)
        if self.poke:
            x.mul_(2)
        k, v = self.to_k(x), self.to_v(x)
        p = torch.softmax(q @ k.transpose(1, 2) / 4, dim=-1)
        return self.to_out(p @ v)


class GQA(nn.Module):
    """Grouped-query projections: a wider q, k and v of one size (no bias)."""

    def __init__(self, d=32):
        super().__init__()
        self.q_proj = nn.Linear(d, 2 * d, bias=False)
        self.k_proj = nn.Linear(d, d // 2, bias=False)
        self.v_proj = nn.Linear(d, d // 2, bias=False)
        self.o_proj = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(q * torch.cat([k, v], dim=-1).repeat(1, 1, 2))


class MLP(nn.Module):
    def __init__(self, d=32, inner=48):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.gqa = GQA()
        self.mlp = MLP()
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        x = x + self.attn(x)
        x = x + self.gqa(x)
        x = x + self.mlp(x)
        return self.head(x)


def get_model():
    torch.manual_seed(0)
    return Model()


def get_inputs():
    return [torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))]
'''

SETS = [["attn.to_q", "attn.to_k", "attn.to_v"], ["gqa.k_proj", "gqa.v_proj"], ["mlp.gate_proj", "mlp.up_proj"]]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    p = tmp_path_factory.mktemp("merge") / "merge_model.py"
    p.write_text(WORKLOAD)
    return str(p)


@pytest.fixture(scope="module")
def merge_ws(tmp_path_factory, workload):
    root = tmp_path_factory.mktemp("merge_ws")
    cfg = root / "forge.toml"
    cfg.write_text(FORGE_TOML)
    ws, _ = profile_into_workspace(workload, root / "ws", device="cpu", config_path=cfg)
    # every card that matches, however this machine's load timed it
    assert main(["merge", workload, "-w", str(ws.root), "--device", "cpu", "--repeats", "5", "--min-speedup", "0"]) == 0
    return ws


def _model(workload):
    return load_workload(workload).build("cpu", None)[0].eval()


def _x(seed=1):
    return torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(seed))


def _merge_cards(man) -> list[str]:
    return sorted(c for c, e in man.entries.items() if e.signature.kind == "merge")


def _status(applied, site: str) -> dict:
    cards = [c for c in applied.status()["cards"] if c["kind"] == "merge" and any(site in s for s in c["sites"])]
    assert len(cards) == 1
    return cards[0]


def test_siblings_are_the_linears_called_on_one_unchanged_input_in_every_call(workload):
    wl = load_workload(workload)
    model, inputs = wl.build("cpu", None)
    sets, why, first, counts = find_siblings(model.eval(), inputs, wl.run)
    assert sets == SETS
    # the wider q of grouped-query attention stays alone, and says why; lone linears say nothing
    assert why == {"gqa.q_proj": "its siblings on the same input have other sizes, biases, dtype or device"}
    assert counts["attn.to_q"] == 1 and first["attn.to_q"].shape == (2, 16, 32)

    # an input changed in place between two calls makes two inputs: no siblings there
    model.attn.poke = True
    sets, why, _, _ = find_siblings(model, [t.clone() for t in inputs], wl.run)
    assert ["attn.to_k", "attn.to_v"] in sets and ["attn.to_q", "attn.to_k", "attn.to_v"] not in sets

    # siblings in one call and not in another: not merged, with why
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) + self.b(x) + self.a(x + 1)

    m = Twice()
    sets, why, _, _ = find_siblings(m, [torch.randn(3, 4)], lambda mod, inp: mod(*inp))
    assert sets == [] and why["a"] == "its input is shared with other linears in some calls and not in others"



def test_a_tensor_made_where_a_freed_one_was_is_another_input(monkeypatch):
    """A temporary freed after one linear's call and another made at its address for the next
    linear's are two inputs: the run keeps no input alive, so it tells them apart by a weak
    reference. Every object here is given one address, as CPython may reuse a freed one."""
    from forge_tui.rewrites import merge as merging_mod

    class Temps(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x + 1) + self.b(x + 2)

    monkeypatch.setattr(merging_mod, "id", lambda obj: 1, raising=False)
    sets, why, _, _ = find_siblings(Temps(), [torch.randn(3, 4)], lambda mod, inp: mod(*inp))
    assert sets == [] and why == {}


def test_linears_that_cannot_share_one_stacked_weight_say_why():
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    assert unmergeable([a, b]) is None
    assert unmergeable([a, nn.Linear(8, 8, bias=False)]) == "their input or output sizes or their biases differ"
    assert unmergeable([a, nn.Linear(8, 4)]) == "their input or output sizes or their biases differ"
    tied = nn.Linear(8, 8)
    tied.weight = a.weight
    assert unmergeable([a, tied]) == "they share a weight"
    assert unmergeable([a, nn.Linear(8, 8).double()]) == "their weights are not of one dtype on one device"
    view = nn.Linear(8, 8)
    view.weight = nn.Parameter(torch.randn(2, 8, 8)[1])
    assert "shares its storage" in unmergeable([a, view])


@pytest.mark.parametrize("bias", [True, False])
def test_the_batched_product_is_each_linear_and_reads_a_transposed_input(bias):
    torch.manual_seed(0)
    holder = nn.Module()
    for n in ("q", "k", "v"):
        holder.add_module(n, nn.Linear(32, 24, bias=bias))
    st = Stacked([(holder, n) for n in ("q", "k", "v")], repoint=False)
    x = torch.randn(2, 32, 16).transpose(1, 2)  # not contiguous, as the diffusion's VAE attention reads it
    outs = merged(x, st)
    for y, n in zip(outs, ("q", "k", "v")):
        assert y.shape == (2, 16, 24) and y.is_contiguous()
        torch.testing.assert_close(y, F.linear(x, holder.get_submodule(n).weight, holder.get_submodule(n).bias))


def test_merge_promotes_cards_with_evidence(merge_ws):
    man = manifest(merge_ws)
    cards = _merge_cards(man)
    assert len(cards) == 3
    groups = []
    for c in cards:
        e = man.entries[c]
        assert e.signature.kind == "merge" and e.evidence.speedup_vs_eager is not None
        assert e.evidence.input_sets == ["captured", "random"]
        data = json.loads((kernels_dir(merge_ws) / e.source).read_text())
        assert [p for g in data["groups"] for p in g] == e.signature.module_paths
        assert data["program"]["members"] == len(data["groups"][0])
        assert isinstance(data["share"], float) and 0 < data["share"] <= 1
        groups += data["groups"]
    assert sorted(groups) == sorted(SETS)
    log = subprocess.run(["git", "-C", str(merge_ws.root), "log", "-1", "--format=%s%n%b", "main"],
                         capture_output=True, text=True, check=True).stdout
    assert "sibling linears" in log and "Forge-Event: approve" in log


def test_a_served_model_matches_eager_with_one_product_per_set_and_undo_unstacks(merge_ws, workload):
    eager, model = _model(workload), _model(workload)
    x = _x()
    before = {id(p): p for p in model.parameters()}
    with torch.no_grad():
        ref = eager(x)
        with apply(model, merge_ws, trial_calls=0, only_faster=False) as applied:
            assert sorted(applied.merges) == _merge_cards(manifest(merge_ws))
            y = model(x)
            model(x)
            for s in SETS:
                st = _status(applied, s[0])
                assert st["active"] and not st["fallbacks"]
                assert st["served"] == 2 * len(s)  # every sibling's call served, in two forwards
                assert st["sites"] == [" + ".join(s)]
                ptrs = {model.get_submodule(p).weight.untyped_storage().data_ptr() for p in s}
                assert len(ptrs) == 1  # one stacked tensor, each weight a view
            groups = {id(m.forward.group) for s in SETS for m in map(model.get_submodule, s)}
            assert len(groups) == len(SETS)
            for g in {model.get_submodule(s[0]).forward.group for s in SETS}:
                assert g.products == 2  # one product a forward, the other siblings took their slices
        for s in SETS:
            assert all("forward" not in model.get_submodule(p).__dict__ for p in s)  # undone
    torch.testing.assert_close(y, ref)
    assert {id(p): p for p in model.parameters()}.keys() == before.keys()
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages)
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        assert torch.equal(p, q), name


def test_a_stored_output_is_returned_only_for_the_same_unchanged_input(merge_ws, workload):
    eager, model = _model(workload), _model(workload)
    attn = model.attn
    with torch.no_grad(), apply(model, merge_ws, trial_calls=0, only_faster=False) as applied:
        model(_x())  # checked
        g = attn.to_q.forward.group
        # the input changed in place after q: k and v are computed again, from the changed input
        attn.poke = eager.attn.poke = True
        a, b = _x(2), _x(2)
        torch.testing.assert_close(attn(a), eager.attn(b), rtol=0, atol=1e-6)
        assert g.products == 3  # q's, then k's again
        attn.poke = eager.attn.poke = False
        # another input of the same values: computed again, never another tensor's slice
        x1, x2 = _x(3), _x(4)
        q1 = attn.to_q(x1)
        k2 = attn.to_k(x2)
        torch.testing.assert_close(k2, eager.attn.to_k(x2), rtol=0, atol=1e-6)
        torch.testing.assert_close(q1, eager.attn.to_q(x1), rtol=0, atol=1e-6)
        # a sibling called twice on one input: its slice once, then a new product
        x3 = _x(5)
        attn.to_q(x3)
        products = g.products
        torch.testing.assert_close(attn.to_k(x3), eager.attn.to_k(x3), rtol=0, atol=1e-6)
        assert g.products == products
        torch.testing.assert_close(attn.to_k(x3), eager.attn.to_k(x3), rtol=0, atol=1e-6)
        assert g.products == products + 1
        # weights loaded in place between the calls: the stored slices are stale, computed again
        x4 = _x(6)
        attn.to_q(x4)
        attn.to_v.weight.mul_(2)
        eager.attn.to_v.weight.mul_(2)
        torch.testing.assert_close(attn.to_v(x4), eager.attn.to_v(x4), rtol=0, atol=1e-6)
        assert _status(applied, "attn.to_q")["active"]
        # each sibling's own parameters' versions decide, not another's: q's changed (values
        # kept), v's not, so v still takes its slice of the product q's call made afterwards
        attn.to_q.weight.mul_(1)
        attn.to_q.weight.mul_(1)
        x5 = _x(7)
        attn.to_q(x5)
        products = g.products
        torch.testing.assert_close(attn.to_v(x5), eager.attn.to_v(x5), rtol=0, atol=1e-6)
        assert g.products == products


def test_merged_linears_fall_back_where_the_product_would_not_compute_what_they_do(merge_ws, workload):
    model = _model(workload)
    lin = model.mlp.gate_proj
    x = _x()
    with apply(model, merge_ws, trial_calls=0, only_faster=False) as applied:
        with torch.no_grad():
            model(x)
        served = _status(applied, "mlp.gate_proj")["served"]
        y = lin(x)  # gradients: the linear's own forward, and the backward works
        y.sum().backward()
        assert lin.weight.grad is not None
        with torch.no_grad():
            with torch.inference_mode():
                lin(x.clone())
            with pytest.raises(RuntimeError):  # the linear's own error, for another dtype
                lin(x.double())
            with pytest.raises(RuntimeError):  # and for another input size
                lin(x[..., :16])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lin(x)
            model.mlp.up_proj.weight = nn.Parameter(model.mlp.up_proj.weight.clone())
            torch.testing.assert_close(model.mlp.up_proj(x), F.linear(x, model.mlp.up_proj.weight))
        fb = _status(applied, "mlp.gate_proj")["fallbacks"]
        assert fb == {"gradients are needed": 1,
                      "an inference tensor (no version counter to prove it unchanged between the calls)": 1,
                      "dtype float64": 1, "input size 16": 1, "autocast is on": 1,
                      "a linear or its weight was replaced since the install": 1}
        assert _status(applied, "mlp.gate_proj")["served"] == served
        assert _status(applied, "mlp.gate_proj")["active"]


def test_a_product_that_does_not_match_is_disabled_at_its_first_call(merge_ws, workload, monkeypatch):
    monkeypatch.setattr(merge_mod, "merged", lambda x, st: [torch.zeros(*x.shape[:-1], st.weight.shape[1])
                                                           for _ in range(st.weight.shape[0])])
    eager, model = _model(workload), _model(workload)
    x = _x()
    with torch.no_grad(), apply(model, merge_ws, trial_calls=0, only_faster=False) as applied:
        y = model(x)
        for s in SETS:
            st = _status(applied, s[0])
            assert not st["active"] and "first-call check" in st["disabled_reason"]
            assert st["served"] == 0 and st["fallbacks"].get("check mismatch") == 1
        torch.testing.assert_close(y, eager(x), rtol=0, atol=0)


def test_a_product_error_disables_the_card_and_returns_the_linears_output(merge_ws, workload, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(merge_mod, "merged", boom)
    eager, model = _model(workload), _model(workload)
    x = _x()
    with torch.no_grad(), apply(model, merge_ws, trial_calls=0, only_faster=False) as applied:
        y = model(x)
        st = _status(applied, "attn.to_q")
        assert not st["active"] and "boom" in st["disabled_reason"]
        assert st["fallbacks"] == {"batched product error": 1, "disabled": 2}
        torch.testing.assert_close(y, eager(x), rtol=0, atol=0)


def test_merges_are_one_switch_off_unit_with_their_share_in_the_bound(merge_ws):
    man = manifest(merge_ws)
    cards = _merge_cards(man)
    served = {c: 1 for c in cards}
    units = switch_off_units(man, served)
    assert sorted(units[0]) == cards
    shares = config_shares(merge_ws, man, served)
    assert sorted(shares) == cards and all(0 < v <= 1 for v in shares.values())
    for c in cards:  # as if each had measured 2x alone: the bound counts each card's share once
        man.entries[c].evidence.speedup_vs_eager = 2.0
    assert _bound(merge_ws, man, served) == pytest.approx(1 / (1 - sum(shares.values()) / 2))
    assert config_shares(merge_ws, man, {}) == {}


def test_merges_are_not_installed_for_torch_compile(merge_ws, workload):
    model = _model(workload)
    applied = apply(model, merge_ws, mode=Mode.TORCH_COMPILE, trial_calls=0, only_faster=False)
    try:
        assert not applied.merges
        for c in _merge_cards(manifest(merge_ws)):
            assert "not served in torch.compile'd models" in applied.skipped[c]
    finally:
        applied.undo()


def test_merge_of_a_model_without_siblings_says_so(tmp_path, capsys):
    ws = tmp_path / "ws"
    profile_into_workspace("example:tiny_mlp", ws, device="cpu")
    assert main(["merge", "example:tiny_mlp", "-w", str(ws), "--device", "cpu"]) == 2
    assert "no linears called one after another on one input" in capsys.readouterr().err


def test_merge_dry_run_promotes_nothing(merge_ws, workload, capsys):
    before = manifest(merge_ws).entries.keys()
    assert main(["merge", workload, "-w", str(merge_ws.root), "--device", "cpu", "--repeats", "3",
                 "--min-speedup", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: 3 merge cards would be promoted" in out
    assert "gqa.q_proj: not merged: its siblings on the same input have other sizes" in out
    assert manifest(merge_ws).entries.keys() == before


def test_a_merge_that_would_keep_a_scope_from_compiling_is_skipped(merge_ws, workload, tmp_path):
    """The attention's softmax is an op card served in the attention's compiled forward; its q/k/v
    merge would make three more modules below it that forge serves, each a graph break, over
    GRAPH_BREAKS, and send the whole attention through the interceptor (on the H200 the VAE
    attention cost the host 234 µs a call more than eager that way). That merge is skipped with
    why, the scope compiles, the other merges are served, and the outputs are eager's."""
    import shutil
    from pathlib import Path

    from forge_tui.config import parse_config
    from forge_tui.evaluator import Evaluator
    from forge_tui.promotion import promote_kernel
    from forge_tui.workspace import Workspace

    shutil.copytree(merge_ws.root, tmp_path / "ws")
    ws = Workspace.open(tmp_path / "ws")
    sm = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    src = (Path(__file__).parent / "candidates" / "cpu" / "softmax_good.cpp").read_text()
    cfg = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}})
    with Evaluator(ws.store, ws.cache, cfg, backend="cpu") as ev:
        r = ev.evaluate(sm, src)
    assert r.correct, r.reason
    promote_kernel(ws, sm.id, src, r, by="test")
    merges = _merge_cards(manifest(ws))
    assert len(merges) == len(SETS)
    model, x = _model(workload), _x()
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, only_faster=False, trial_calls=0) as applied:
            got = model(x)
            assert "attn" in applied.scopes and applied.scopes["attn"].sites == {sm.id: 1}
            skipped = {c: why for c, why in applied.skipped.items() if c in merges}
            assert len(skipped) == 1 and "would keep the scope attn from running compiled" in next(iter(skipped.values()))
            assert len(applied.merges) == len(SETS) - 1
            st = {c["card"]: c for c in applied.status()["cards"]}
            assert st[sm.id]["served"] == 1
    torch.testing.assert_close(got, expected)
