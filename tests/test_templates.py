"""The template proposer: every family generated, built and passed by the evaluator on the cpu
backend; moves; CUDA variants built with nvcc (where nvcc is, as on CI)."""

import dataclasses
import json
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import timed_win

from forge_tui.cards import Card
from forge_tui.config import parse_config
from forge_tui.evaluator import EvalOptions, Evaluator
from forge_tui.kernels.device import DEFAULT_DEVICE, DeviceProps, detect_device
from forge_tui.kernels.family import describe, parse_header
from forge_tui.search.proposer import NodeView, ProposalContext
from forge_tui.templates.base import numel, ring_stash, stash_bytes
from forge_tui.templates.proposer import TemplateProposer
from forge_tui.templates.registry import match, matches
from forge_tui.workspace import profile_into_workspace

HERE = Path(__file__).parent
FAMILIES = {"softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm", "elementwise", "avg_pool", "max_pool"}
CFG = parse_config({"timing": {"warmup": 1, "repeats": 3}, "evaluator": {"run_timeout_s": 60.0}})


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpl")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 2\n")
    w, _ = profile_into_workspace(HERE / "data" / "workloads" / "families.py", root / "ws", device="cpu",
                                  config_path=cfg)
    return w


@pytest.fixture(scope="module")
def matched(ws):
    out = {}
    for card in ws.cards():
        fam, m = match(card)
        if fam is not None:
            out.setdefault(m.family, []).append((card, fam, m))
    return out


def test_every_family_is_recognised(matched):
    assert FAMILIES <= set(matched), set(matched)
    kinds = {(m.family, c.kind) for cards in matched.values() for c, _, m in cards}
    assert ("rms_norm", "module") in kinds and ("elementwise", "module") in kinds  # fused gates and RMSNorm
    assert ("batch_norm", "module") in kinds and ("batch_norm", "op") in kinds  # nn.BatchNorm2d: output alone
    logs = [m for c, f, m in matched["softmax"] if m.info["log"]]
    assert logs, "log_softmax"


def test_every_family_passes_the_evaluator_on_cpu(ws, matched):
    passed = {}
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        for family, cards in matched.items():
            for card, fam, m in cards:
                params = fam.initial(m, "cpu")
                r = ev.evaluate(card, fam.render(m, params, "cpu"), EvalOptions(timing=False))
                assert r.status == "passed", (family, card.id, r.reason, (r.build.log if r.build else "")[:800])
                passed[family] = passed.get(family, 0) + 1
    assert set(passed) >= FAMILIES
    assert sum(passed.values()) >= 14


def test_cpu_softmax_matches_eager_on_special_values(tmp_path):
    """The cpu softmax's vectorised exp: rows with a NaN, a +inf, all -inf, some -inf, a 200-wide
    range and a constant come out as eager's, NaN and -inf exactly where eager has them."""
    import torch

    from forge_tui.evaluator.build import Builder
    from forge_tui.kernel_abi import Library
    from forge_tui.kernels.family import Match
    from forge_tui.templates.families.softmax import Softmax

    rows, cols = 6, 4096
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)) * 30
    x[0, 5] = float("nan")
    x[1, :] = float("-inf")
    x[2, 7] = float("inf")
    x[3, ::3] = float("-inf")
    x[4] = torch.linspace(-200, 0, cols)
    x[5] = 1.0
    builder = Builder("cpu", tmp_path)
    for tin, tout, log, tol in (("float32", "float32", False, 1e-6), ("bfloat16", "float32", True, 1e-6),
                                ("bfloat16", "bfloat16", False, 4e-3)):
        m = Match("softmax", None, {"rows": rows, "cols": cols, "tin": tin, "tout": tout, "log": log})
        built = builder.build(Softmax().render(m, {"chunk": 1}, "cpu"))
        assert built.ok, built.reason
        xi = x.to(getattr(torch, tin))
        y = torch.full((rows, cols), 7.0, dtype=getattr(torch, tout))
        Library(str(built.library)).bind([xi], [y], [], None)()
        ref = (torch.log_softmax if log else torch.softmax)(xi.float(), -1).to(getattr(torch, tout)).float()
        y = y.float()
        assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert fin[4].all() and fin[5].all() and not fin[0].any() and not fin[1].any()
        assert torch.allclose(y[fin], ref[fin], rtol=tol, atol=1e-7), (tin, tout, log)


def test_unsupported_cards_are_reported_not_faked(tmp_path):
    card = Card(id="mm", kind="op", target="aten.mm.default", label="", inputs=[], outputs=[],
                program={"nodes": [{"op": "aten.mm.default", "args": [{"$in": 0}, {"$in": 1}]}], "outputs": []})
    why = TemplateProposer().supports(card, "cuda")
    assert why and "no template family" in why and "LLM" in why


def ctx_for(card, parent_source=None, moves=(), parent_id="root"):
    view = NodeView(id=parent_id, parent=None, status="passed", speedup=1.0, move="", source=parent_source)
    return ProposalContext(card=card, backend="cuda", parent=view, lineage=[view], best=None, improvements=[],
                           regressions=[], failed_siblings=[], children=[], reference_source="",
                           tree_moves=list(moves))


def test_moves_are_one_axis_transformations(matched):
    card, fam, m = matched["softmax"][0]
    prop = TemplateProposer()
    first = prop.propose(ctx_for(card))
    assert first.meta["params"] == fam.initial(m, "cuda")  # the root's first child is the heuristic choice
    assert parse_header(first.source)["params"] == first.meta["params"]
    moves = [first.move]
    child = prop.propose(ctx_for(card, parent_source=first.source, moves=moves, parent_id="n0001"))
    if len(matches(card)) > 1:  # the first move from a hand-written family's kernel: the generator's
        assert child.meta["family"] == "generated"
        moves.append(child.move)
        child = prop.propose(ctx_for(card, parent_source=first.source, moves=moves, parent_id="n0001"))
    a, b = first.meta["params"], child.meta["params"]
    changed = [k for k in a if a[k] != b[k]]
    assert len(changed) == 1 or "mode" in changed
    assert child.move not in moves and child.meta["family"] == first.meta["family"]


def test_a_proposal_goes_through_the_configurations_once_a_card(matched, monkeypatch):
    """The softmax family's axes make some 450,000 configurations (221 distinct kernels): the
    proposer goes through them once a card, not at every proposal (each took seconds of the search's
    time), and hands out the same moves as before, one axis from their parent."""
    from forge_tui.templates.families.softmax import Softmax

    card, fam, m = matched["softmax"][0]
    calls = [0]
    valid = Softmax.valid

    def counted(self, *a, **k):
        calls[0] += 1
        return valid(self, *a, **k)

    monkeypatch.setattr(Softmax, "valid", counted)
    prop = TemplateProposer()
    first = prop.propose(ctx_for(card))
    once = calls[0]
    assert once > 100_000  # the whole product, once
    moves = [first.move]
    for _ in range(5):
        child = prop.propose(ctx_for(card, parent_source=first.source, moves=moves, parent_id="n0001"))
        moves.append(child.move)
        if child.meta["family"] == "softmax":
            a, b = first.meta["params"], child.meta["params"]
            assert len([k for k in fam.relevant(a) if a[k] != b.get(k)]) == 1 or a["mode"] != b["mode"]
    prop.propose(ctx_for(card, moves=moves))  # the root's next child
    assert calls[0] - once < 1000, calls[0] - once


def test_no_move_is_handed_out_twice_under_concurrency(matched):
    card, fam, m = matched["layer_norm"][0]
    prop = TemplateProposer()
    moves, lock = [], threading.Lock()

    def go():
        p = prop.propose(ctx_for(card))
        with lock:
            moves.append(p.move if p else None)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [x for x in moves if x]
    assert len(got) == len(set(got)) >= 3


def test_template_search_on_cpu(ws, matched):
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search

    card, _, _ = matched["rms_norm"][0]
    # one thread each (eager and the candidates): under CI's two workers on two cores, a two-thread
    # eager shares its cores with the other worker and the paired ratios swing
    cfg = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0},
                        "search": {"max_evals": 3, "parallel": 2, "min_gain": 0.0}})

    def search(attempt: int):
        pool = LocalEvalPool(ws.store, ws.cache, cfg, backend="cpu")
        try:
            summary = Search(ws, cfg, TemplateProposer(), pool, cards=[card.id]).run()
        finally:
            pool.close()
        assert summary.evaluations == 3
        # a template beat eager on the CPU (a loaded machine may say otherwise: the search goes on)
        return summary, card.id in summary.best and summary.best[card.id]["node"] != "root"

    timed_win(search)


# ---- CUDA: every variant builds -----------------------------------------------------------------
def _retyped(card: Card, dtype: str, out_dtype: str | None = None) -> Card:
    """The same card with its float tensors in another dtype (what a bf16/fp16 model captures)."""
    data = json.loads(card.model_dump_json())
    floats = ("float32", "float16", "bfloat16")
    for s in data["inputs"]:
        if s["dtype"] in floats:
            s["dtype"] = dtype
    for k, s in enumerate(data["outputs"]):
        if s["dtype"] in floats:
            s["dtype"] = out_dtype if (out_dtype and k == 0) else dtype
    for node in data["program"]["nodes"]:
        for meta in node.get("out") or []:
            if meta and meta[1] in floats:
                meta[1] = dtype
    return Card.model_validate(data)


def _reshaped(card: Card, shape: list[int]) -> Card:
    """A softmax card, or a group_norm card with 32 groups, at another (anchor-sized) shape."""
    data = json.loads(card.model_dump_json())
    stride = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        stride[d] = stride[d + 1] * shape[d + 1]
    data["inputs"][0].update(shape=list(shape), stride=stride)
    data["outputs"][0].update(shape=list(shape), stride=stride)
    nodes = data["program"]["nodes"]
    for node in nodes:
        for meta in node.get("out") or []:
            if meta and len(meta[0]) == len(shape):
                meta[0] = list(shape)
    if nodes[0]["op"] == "aten.native_group_norm.default":
        args = nodes[0]["args"]
        g = args[6] = 32
        args[3], args[4], args[5] = shape[0], shape[1], shape[2] * shape[3]
        for k in (1, 2):
            data["outputs"][k].update(shape=[shape[0], g], stride=[g, 1])
        for k in (1, 2):
            data["inputs"][k].update(shape=[shape[1]], stride=[1])
        nodes[0]["out"] = [[list(shape), nodes[0]["out"][0][1]], [[shape[0], g], nodes[0]["out"][1][1]],
                           [[shape[0], g], nodes[0]["out"][2][1]]]
    return Card.model_validate(data)


def test_anchor_shapes_choose_the_modes_they_need(matched):
    """Long rows: a cluster of blocks holds a row (one pass); a handful of long rows: split with a
    workspace; groups: the split group_norm with a workspace."""
    sm = next(c for c, f, m in matched["softmax"] if not m.info["log"])
    vocab = _retyped(_reshaped(sm, [512, 262144]), "bfloat16", "float32")  # F.softmax(x, -1, dtype=float32)
    fam, m = match(vocab)
    p = fam.initial(m, "cuda")
    # one DRAM read, persistent clusters of 8 (an eighth of a row, 64 KB, in shared memory) at two
    # blocks an SM; 16-byte stores of the fp32 output
    assert p["mode"] == "ring" and p["cl"] == 8 and p["bps"] == 2 and p["vec"] == 4 and fam.passes(m, p) == 1, p
    src = fam.render(m, p, "cuda")
    assert "cudaOccupancyMaxActiveClusters" in src and "cudaLaunchKernelEx" in src and "cp.async.bulk" in src
    assert "softmax_ring<TI, TO, 8, 512, 4, false, true>" in src and ", 32768, (int)ROWS" in src  # all of it stashed
    assert "softmax_ring<TI, TO, 8, 512, 4, false, false>" in fam.render(m, {**p, "load": "thread"}, "cuda")
    moves = {q["mode"]: q for q in TemplateProposer().neighbours(fam, m, p, "cuda")}
    assert moves["online"]["tpr"] == 1024 and fam.passes(m, moves["online"]) == 2  # two passes from DRAM
    # a cluster of 16 (non-portable) is opted into by the ring launch, refused by the other modes
    assert fam.valid(m, {**p, "cl": 16, "bps": 2, "tpr": 512}, "cuda")
    assert "NonPortableClusterSizeAllowed" in fam.render(m, {**p, "cl": 16, "bps": 2, "tpr": 512}, "cuda")
    assert not fam.valid(m, {**p, "mode": "stash", "cl": 16}, "cuda")
    # a half row does not fit: the rest of each segment is read twice
    half = {**p, "cl": 2}
    assert fam.valid(m, half, "cuda") and f", {ring_stash(131072, 2, 2048, 2, DEFAULT_DEVICE)}, (int)ROWS" in fam.render(m, half, "cuda")
    assert ring_stash(131072, 2, 2048, 2, DEFAULT_DEVICE) * 2 == 112 * 1024
    stream = moves["stream"]  # one DRAM read, reads and writes overlapping: work items in order, the
    assert fam.passes(m, stream) == 1 and stream["ahead"] == 16  # write of a row 16 rows (24 MB) later
    assert stream["tpr"] == 512 and moves["stash"]["tpr"] == 512
    src = fam.render(m, stream, "cuda")
    assert "forge_launch_ws" in src and "cudaMemsetAsync" in src and "softmax_stream<" in src
    stash = moves["stash"]
    assert fam.passes(m, stash) == 1  # one DRAM read, the segments stashed in shared memory
    src = fam.render(m, stash, "cuda")
    assert "__cluster_dims__" in src and "cudaFuncAttributeMaxDynamicSharedMemorySize" in src
    cluster = {**p, "mode": "cluster", "cl": 8, "tpr": 1024}
    assert fam.valid(m, cluster, "cuda") and fam.passes(m, cluster) == 1
    src = fam.render(m, cluster, "cuda")
    assert "__cluster_dims__" in src and "forge_launch_ws" not in src
    # many rows that fit registers: one pass; every move from there is a complete configuration
    # (a missing axis value once made every proposal for this card fail)
    fam, m = match(_retyped(_reshaped(sm, [16384, 4096]), "bfloat16"))
    p = fam.initial(m, "cuda")
    assert p["mode"] == "regs" and set(p) >= set(fam.axes(m, "cuda")), p
    moves = TemplateProposer().neighbours(fam, m, p, "cuda")
    assert {q["mode"] for q in moves} >= {"online", "split", "cluster"} and all(fam.valid(m, q, "cuda") for q in moves)
    fam, m = match(_reshaped(sm, [4, 262144]))
    p = fam.initial(m, "cuda")
    assert p["mode"] == "split" and 4 * p["segs"] >= 264, p
    src = fam.render(m, p, "cuda")
    assert "forge_launch_ws" in src and "forge_workspace_bytes" in src
    gn_card = matched["group_norm"][0][0]
    fam, m = match(_reshaped(gn_card, [2, 512, 128, 128]))  # 64 groups of 1 MB
    assert m.info["group_len"] == 16 * 128 * 128
    p = fam.initial(m, "cuda")
    # one read from DRAM, persistent: clusters of 16 walking the groups at three blocks an SM, each
    # block's sixteenth (64 KB) staged by its threads as they write the previous group
    assert p["mode"] == "ring" and (p["cl"], p["threads"], p["bps"], p["load"]) == (16, 512, 3, "thread"), p
    assert fam.passes(m, p) == 1
    src = fam.render(m, p, "cuda")
    assert "gn_ring<TX, TW, TB, TO, TS, 16, 512, 4, false>" in src and ", 16384, (int)NG" in src
    assert "cudaOccupancyMaxActiveClusters" in src and "NonPortableClusterSizeAllowed" in src
    assert "cp.async.bulk" in fam.render(m, {**p, "load": "bulk"}, "cuda")
    modes = {q["mode"]: q for q in TemplateProposer().neighbours(fam, m, p, "cuda")}
    assert set(modes) >= {"cluster", "split", "stream", "stash"} and fam.passes(m, modes["cluster"]) == 1
    # the stash: a cluster per group, each block stashing its eighth in shared memory
    stash = modes["stash"]
    assert stash["threads"] == 1024 and stash["cl"] == 8 and fam.passes(m, stash) == 1
    src = fam.render(m, stash, "cuda")
    assert "__cluster_dims__" in src and "cudaFuncAttributeMaxDynamicSharedMemorySize" in src
    stream = modes["stream"]  # work items in order, normalisation AHEAD groups (16 MB) after the statistics
    assert fam.passes(m, stream) == 1 and stream["ahead"] == 16
    # a mode move takes that mode's measured thread count (the stash's 1024 make the stream spill)
    assert stream["threads"] == 512 and modes["split"]["threads"] == 512
    src = fam.render(m, stream, "cuda")
    assert "forge_launch_ws" in src and "cudaMemsetAsync" in src and "atomicAdd(ticket" in src
    fam, m = match(_retyped(_reshaped(gn_card, [1, 512, 256, 256]), "bfloat16"))  # 2 MB groups
    p = fam.initial(m, "cuda")
    # a ring block's sixteenth of a group is 128 KB: at two blocks an SM 112 KB of it in shared
    # memory, the rest read twice
    assert p["mode"] == "ring" and p["bps"] == 2 and fam.passes(m, p) == 1, p
    assert f", {112 * 1024 // 2}, (int)NG" in fam.render(m, p, "cuda")
    modes = {q["mode"]: q for q in TemplateProposer().neighbours(fam, m, p, "cuda")}
    assert modes["stream"]["ahead"] == 8 and fam.passes(m, modes["stash"]) == 1 and fam.passes(m, modes["split"]) == 2
    assert modes["stash"]["threads"] == 1024 and modes["stream"]["threads"] == 512
    assert "cluster" not in modes  # too large for a cluster's registers
    src = fam.render(m, modes["split"], "cuda")
    assert "forge_launch_ws" in src and "cudaMalloc" not in src
    # a stash block asks for enough shared memory that at most bps blocks share an SM
    for bps in (1, 2, 4):
        smem = stash_bytes(bps, DEFAULT_DEVICE) + 1024
        assert bps * smem <= 228 * 1024 < (bps + 1) * smem


def test_max_pool_module_card_skips_the_indices(matched):
    """nn.MaxPool2d returns the values alone: its module card's kernel never computes or writes
    PyTorch's indices, while the op card (both outputs) writes them."""
    cards = {c.kind: (c, f, m) for c, f, m in matched["max_pool"]}
    assert set(cards) == {"op", "module"}
    op, mod = cards["op"], cards["module"]
    assert op[2].info["idx"] and not mod[2].info["idx"]
    assert len(mod[0].outputs) == 1 and mod[0].outputs[0].dtype == "float32"
    for c, fam, m in (op, mod):
        p = fam.initial(m, "cuda")
        assert p["mode"] == "strip", p  # ResNet's 3x3/2 pool: 16-byte row vectors and lane shuffles first
        for q in [p] + TemplateProposer().neighbours(fam, m, p, "cuda"):
            src = fam.render(m, q, "cuda")
            assert ("out[1].data" in src) == m.info["idx"], (c.kind, q)
            assert ("idx + o" in src) and (("nullptr, (nc" in src or "nullptr, o" in src) != m.info["idx"])
    # the module card is what the runtime can replace: nn.MaxPool2d's forward, values only
    assert mod[0].target == "module:MaxPool2d" and mod[0].bytes < op[0].bytes
    # a 2x2/2 pool (VGG, U-Net) has no strip: windows read through L1 first (the shared-memory
    # tile measured slower on the H200), the tile a move with its rows a block
    data = json.loads(op[0].model_dump_json())
    n, c, h, w = data["inputs"][0]["shape"]
    data["program"]["nodes"][0]["args"][1:4] = [[2, 2], [2, 2], [0, 0]]
    for o in data["outputs"]:
        o.update(shape=[n, c, h // 2, w // 2], stride=[c * (h // 2) * (w // 2), (h // 2) * (w // 2), w // 2, 1])
    fam, m = match(Card.model_validate(data))
    assert m.info["k"] == [2, 2] and m.info["oh"] == h // 2
    p = fam.initial(m, "cuda")
    assert p["mode"] == "thread" and "strip" not in fam.axes(m, "cuda")["mode"], p
    tile = next(q for q in TemplateProposer().neighbours(fam, m, p, "cuda") if q["mode"] == "tile")
    assert fam.valid(m, tile, "cuda") and "TX tile[IN_ROWS * W]" in fam.render(m, tile, "cuda")


# ---- the GPU the first choices are for -----------------------------------------------------------
# a smaller GPU without thread-block clusters (sm_80), and an sm_90 one with less shared memory an SM
SMALL = DeviceProps(name="small sm_80", sms=80, smem_per_sm=100 * 1024, smem_per_block=99 * 1024, l2_bytes=40 << 20,
                    capability=(8, 0), max_threads_per_sm=2048)
LEAN_SM90 = dataclasses.replace(DEFAULT_DEVICE, name="sm_90, 100 KiB an SM", smem_per_sm=100 * 1024,
                                smem_per_block=99 * 1024)
CLUSTER_MODES = {"ring", "stash", "cluster"}


def test_the_default_device_is_the_h200(monkeypatch):
    """Without a CUDA device the templates assume the H200; with one, the proposer reads its
    properties through torch."""
    import torch

    assert DEFAULT_DEVICE == DeviceProps(name="NVIDIA H200", sms=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
                                         l2_bytes=60 << 20, capability=(9, 0), max_threads_per_sm=2048)
    assert DEFAULT_DEVICE.clusters and LEAN_SM90.clusters and not SMALL.clusters
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect_device() == DEFAULT_DEVICE and TemplateProposer().device == DEFAULT_DEVICE
    a100 = SimpleNamespace(name="NVIDIA A100-SXM4-80GB", multi_processor_count=108, shared_memory_per_multiprocessor=167936,
                           shared_memory_per_block_optin=166912, L2_cache_size=41943040, major=8, minor=0,
                           max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: a100)
    found = DeviceProps(name="NVIDIA A100-SXM4-80GB", sms=108, smem_per_sm=164 * 1024, smem_per_block=163 * 1024,
                        l2_bytes=40 << 20, capability=(8, 0), max_threads_per_sm=2048)
    assert detect_device() == found and TemplateProposer().device == found and not found.clusters
    assert TemplateProposer(device=SMALL).device == SMALL


def test_first_choices_follow_the_device(matched):
    """First choices and grid sizes come from the device: on a smaller sm_80 GPU no cluster mode
    (ring, stash, cluster) is offered, valid or chosen, persistent grids and splits follow its SMs
    and the stream modes' distance its L2; with less shared memory an SM, the rings keep less in
    it. The default device gives the H200's choices."""
    sm = next(c for c, f, m in matched["softmax"] if not m.info["log"])
    gn_card = matched["group_norm"][0][0]
    small = TemplateProposer(device=SMALL)

    # many long rows: the ring on the H200; two passes in a block per row without clusters
    fam, m = match(_retyped(_reshaped(sm, [512, 262144]), "bfloat16", "float32"))
    p = fam.initial(m, "cuda")
    assert p == fam.initial(m, "cuda", DEFAULT_DEVICE) == TemplateProposer(device=DEFAULT_DEVICE).propose(ctx_for(m.card)).meta["params"]
    assert (p["mode"], p["cl"], p["bps"], p["ahead"]) == ("ring", 8, 2, 16), p
    q = fam.initial(m, "cuda", SMALL)
    assert q["mode"] == "online" and q["ahead"] == 8, q  # 8 rows (12 MB) ahead in a 40 MB L2, 16 (24 MB) in 60 MB
    assert q == small.propose(ctx_for(m.card)).meta["params"]
    assert fam.axes(m, "cuda", SMALL)["mode"] == ["stream", "online", "split"]
    assert not fam.valid(m, p, "cuda", SMALL) and fam.valid(m, p, "cuda", DEFAULT_DEVICE)
    modes = {r["mode"] for r in small.neighbours(fam, m, q, "cuda")}
    assert modes == {"online", "stream", "split"}, modes
    # the stream mode's persistent grid: two blocks of 512 threads an SM
    stream = {**q, "mode": "stream", **fam.mode_settings(m, "stream", "cuda", SMALL)}
    assert "<<<264, 512, 0, s>>>" in fam.render(m, stream, "cuda") and "<<<160, 512, 0, s>>>" in fam.render(m, stream, "cuda", SMALL)
    # an eighth of a row (64 KB) does not fit a block's share of 100 KiB at two blocks an SM: clusters of 16
    r = fam.initial(m, "cuda", LEAN_SM90)
    assert (r["mode"], r["cl"], r["bps"]) == ("ring", 16, 2), r
    assert ", 16384, (int)ROWS" in fam.render(m, r, "cuda", LEAN_SM90)
    # a few long rows: segments enough for 4 blocks an SM; 200 rows fill 80 SMs unsplit
    fam, m = match(_reshaped(sm, [100, 262144]))
    assert fam.initial(m, "cuda")["segs"] == 8 and fam.initial(m, "cuda", SMALL)["segs"] == 4
    fam, m = match(_reshaped(sm, [200, 262144]))
    assert fam.initial(m, "cuda")["mode"] == "split" and fam.initial(m, "cuda", SMALL)["mode"] == "online"

    # group_norm, 64 groups of 1 MB: the ring on the H200, split without clusters
    fam, m = match(_reshaped(gn_card, [2, 512, 128, 128]))
    p = fam.initial(m, "cuda")
    assert (p["mode"], p["cl"], p["threads"], p["bps"], p["ahead"]) == ("ring", 16, 512, 3, 16), p
    q = fam.initial(m, "cuda", SMALL)
    assert q["mode"] == "split" and q["ahead"] == 8 and fam.axes(m, "cuda", SMALL)["mode"] == ["stream", "split"], q
    assert {r["mode"] for r in small.neighbours(fam, m, q, "cuda")} == {"split", "stream"}
    assert not any(fam.valid(m, {**p, "mode": mode}, "cuda", SMALL) for mode in CLUSTER_MODES)
    stream = {**q, "mode": "stream", **fam.mode_settings(m, "stream", "cuda", SMALL)}
    assert "<<<264, 512, 0, s>>>" in fam.render(m, stream, "cuda") and "<<<160, 512, 0, s>>>" in fam.render(m, stream, "cuda", SMALL)
    # a sixteenth of a group (64 KB) does not fit a block's share of 100 KiB at three blocks an SM: two
    r = fam.initial(m, "cuda", LEAN_SM90)
    assert (r["mode"], r["cl"], r["bps"]) == ("ring", 16, 2), r
    assert ", 12288, (int)NG" in fam.render(m, r, "cuda", LEAN_SM90)  # 48 KB of each 64 KB kept

    # elementwise: a wave is the blocks resident on the whole GPU at once
    # (the first by id that still matches at that shape: the cards' order follows their measured
    # shares, and an in-place or dtype-changing one does not reshape into a match)
    ew = next(c for c, f, m in sorted(matched["elementwise"], key=lambda t: t[0].id)
              if len(c.inputs) == 1 and match(_reshaped(c, [4096, 4096]))[0] is not None)
    fam, m = match(_reshaped(ew, [4096, 4096]))
    p = {**fam.initial(m, "cuda"), "threads": 256, "grid": "waves1"}
    assert "<<<1056, 256, 0, s>>>" in fam.render(m, p, "cuda") and "<<<640, 256, 0, s>>>" in fam.render(m, p, "cuda", SMALL)

    # a stash block's request caps the blocks an SM at bps, whatever the SM's shared memory
    for device in (DEFAULT_DEVICE, SMALL, LEAN_SM90):
        for bps in (1, 2, 4):
            smem = stash_bytes(bps, device) + 1024
            assert bps * smem <= device.smem_per_sm < (bps + 1) * smem, (device.name, bps)


def test_the_generator_competes_with_a_hand_written_family(matched):
    """A hand-written family keeps priority (the root's first child), the generator's first choice
    comes next where it serves the card too, and each node's children stay in its family."""
    card, fam, m = next((c, f, mm) for c, f, mm in matched["rms_norm"] if c.kind == "module")
    assert [mm.family for _, mm in matches(card)] == ["rms_norm", "generated"]
    prop = TemplateProposer()
    first = prop.propose(ctx_for(card))
    second = prop.propose(ctx_for(card, moves=[first.move]))
    third = prop.propose(ctx_for(card, moves=[first.move, second.move]))
    assert (first.meta["family"], second.meta["family"], third.meta["family"]) == ("rms_norm", "generated", "rms_norm")
    gen_fam, gen_m = matches(card)[1]
    assert second.meta["params"] == gen_fam.initial(gen_m, "cuda") and "forge-template" in second.source
    moves = [first.move, second.move, third.move]
    child = prop.propose(ctx_for(card, parent_source=second.source, moves=moves, parent_id="n0002"))
    assert child.meta["family"] == "generated"  # a generated node's children stay generated
    a, b = second.meta["params"], child.meta["params"]
    assert sum(a[k] != b[k] for k in a) == 1
    # with a budget that expands the first child before the root's second, the switch to the
    # generator is that child's first move, once a card
    fresh = TemplateProposer()
    one = fresh.propose(ctx_for(card))
    two = fresh.propose(ctx_for(card, parent_source=one.source, moves=[one.move], parent_id="n0001"))
    assert two.meta["family"] == "generated" and two.meta["params"] == gen_fam.initial(gen_m, "cuda")
    three = fresh.propose(ctx_for(card, moves=[one.move, two.move]))  # the root, widened later
    assert three.meta["family"] == "rms_norm"
    # a card the generator alone serves has one family
    gen_only = next((c for c in ws_cards(matched) if match(c)[0] is not None and match(c)[0].name == "generated"), None)
    if gen_only is not None:
        assert [mm.family for _, mm in matches(gen_only)] == ["generated"]


def ws_cards(matched):
    return [c for cards in matched.values() for c, _, _ in cards]


def test_no_cluster_mode_is_proposed_without_clusters(matched):
    """On a GPU without thread-block clusters the proposer hands out no cluster mode, from the
    root or from a child, on the shapes whose first choices on the H200 are cluster modes."""
    sm = next(c for c, f, m in matched["softmax"] if not m.info["log"])
    gn_card = matched["group_norm"][0][0]
    for card in (_retyped(_reshaped(sm, [512, 262144]), "bfloat16", "float32"), _reshaped(gn_card, [2, 512, 128, 128])):
        assert TemplateProposer().propose(ctx_for(card)).meta["params"]["mode"] == "ring"
        prop = TemplateProposer(device=SMALL)
        assert prop.supports(card, "cuda") is None
        first = prop.propose(ctx_for(card))
        got = [first]
        for parent, parent_id in ((None, "root"), (first.source, "n0001")):
            for _ in range(12):
                p = prop.propose(ctx_for(card, parent_source=parent, moves=[g.move for g in got], parent_id=parent_id))
                if p is None:
                    break
                got.append(p)
        assert len(got) >= 12
        for p in got:  # the family's modes, and the generator's kernels (its second child) alike
            assert p.meta["params"].get("mode") not in CLUSTER_MODES and p.meta["params"].get("split", 1) == 1, p.move
            assert "cudaLaunchKernelEx" not in p.source and "cudaFuncAttributeMaxDynamicSharedMemorySize" not in p.source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_vector_stores_stay_whole(matched, tmp_path):
    """A 16-byte store_vec is one st.global.v4 in the PTX: nvcc once split these into four 4-byte
    stores in the ring and stream kernels (the L2 merging them made a store phase 2.4x slower on
    the H200). Only statistics are stored as scalars: mean and rstd, and in the stream mode a
    piece's count, mean and M2."""
    import re
    import subprocess

    gn_card = matched["group_norm"][0][0]
    fam, m = match(_reshaped(gn_card, [2, 512, 128, 128]))
    p0 = fam.initial(m, "cuda")
    abi = Path(__file__).resolve().parent.parent / "forge_tui" / "abi"
    for mode, scalars in (("ring", 2), ("stream", 5), ("stash", 2)):
        q = {**p0, "mode": mode, **fam.mode_settings(m, mode, "cuda")}
        src = tmp_path / f"{mode}.cu"
        src.write_text(fam.render(m, q, "cuda"))
        ptx = tmp_path / f"{mode}.ptx"
        subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-std=c++17", "-ptx", "-I", str(abi), str(src), "-o", str(ptx)],
                       check=True, capture_output=True, timeout=300)
        entries = {e.split("(")[0]: e for e in re.split(r"\.visible \.entry ", ptx.read_text())[1:]}
        vec4 = [e for name, e in entries.items() if "Li4E" in name]  # the VEC=4 instantiation
        assert vec4, (mode, list(entries))
        for e in vec4:
            assert len(re.findall(r"st\.global\.v4\.[bf]32", e)) >= 4, mode
            assert len(re.findall(r"st\.global\.f32\s", e)) <= scalars, mode
    # 32 bytes a thread (8 bf16 in, 8 fp32 out; no longer a softmax move, other templates can widen
    # so): two 16-byte stores, never eight 4-byte ones (the struct store did that, and the vocab
    # softmax ring at vec=8 took 1221 µs, 356 after this change, against 249 at vec=4)
    sm = next(c for c, f, m in matched["softmax"] if not m.info["log"])
    fam, m = match(_retyped(_reshaped(sm, [512, 262144]), "bfloat16", "float32"))
    assert 8 not in fam.axes(m, "cuda")["vec"]
    src = tmp_path / "ring8.cu"
    src.write_text(fam.render(m, {**fam.initial(m, "cuda"), "vec": 8}, "cuda"))
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-std=c++17", "-ptx", "-I", str(abi), str(src), "-o",
                    str(tmp_path / "ring8.ptx")], check=True, capture_output=True, timeout=300)
    entries = {e.split("(")[0]: e for e in re.split(r"\.visible \.entry ", (tmp_path / "ring8.ptx").read_text())[1:]}
    vec8 = [e for name, e in entries.items() if "Li8ELb0ELb1E" in name]  # VEC=8, bulk loads
    assert len(vec8) == 1, list(entries)
    assert len(re.findall(r"st\.global\.v4\.b32", vec8[0])) >= 2 and not re.findall(r"st\.global\.f32\s", vec8[0])


def _last_positions(card: Card, batch: int, seq: int, keep: int, cols: int) -> Card:
    """A softmax card over ``logits[:, -keep:, :]`` of [batch, seq, cols] logits: rows in place."""
    data = json.loads(card.model_dump_json())
    data["inputs"][0].update(shape=[batch, keep, cols], stride=[seq * cols, cols, 1])
    data["outputs"][0].update(shape=[batch, keep, cols], stride=[keep * cols, cols, 1])
    for node in data["program"]["nodes"]:
        for meta in node.get("out") or []:
            if meta:
                meta[0] = [batch, keep, cols]
    return Card.model_validate(data)


def test_softmax_reads_rows_in_place(matched):
    """A softmax over the last positions' logits (rows contiguous, the positions strided) is served
    where its rows are, without a copy: the kernels find each row through XROW, and the entry point
    checks the card's strides."""
    from forge_tui.templates.families.softmax import row_layout

    assert row_layout([64, 256], [256, 1], 4) == ((64, 256),)
    assert row_layout([4, 1, 8, 256], [2048, 2048, 256, 1], 4) == ((32, 256),)  # nested dims merge
    assert row_layout([8, 3, 256], [2048, 256, 1], 4) == ((8, 2048), (3, 256))
    assert row_layout([8, 3, 6], [64, 6, 1], 4) is None  # a row would start off a 16-byte boundary
    assert row_layout([256, 64], [1, 256], 4) is None  # rows not contiguous
    assert row_layout([2, 2, 2, 256], [4096, 1024, 256 * 8, 1], 4) is None  # three strided levels
    strided = [(c, m) for c, f, m in matched["softmax"] if len(m.info["xrows"]) == 2]
    assert strided and strided[0][1].info["xrows"] == ((8, 2048), (3, 256)), [m.info for _, _, m in matched["softmax"]]
    card = strided[0][0]
    fam, m = match(card)
    cpu = fam.render(m, fam.initial(m, "cpu"), "cpu")
    assert "#define XROW(r) ((int64_t)(r) / 3 * 2048LL + (int64_t)(r) % 3 * 256LL)" in cpu
    assert "in[0].stride[0] != 2048" in cpu and "forge_is_contiguous(&in[0])" not in cpu
    # the decoder's sampling softmax: 128 of 1024 positions, a 262144-token vocabulary, bf16 in, fp32 out
    fam, m = match(_retyped(_last_positions(card, 4, 1024, 128, 262144), "bfloat16", "float32"))
    assert m is not None and m.info["rows"] == 512
    p = fam.initial(m, "cuda")
    assert p["mode"] == "ring" and fam.passes(m, p) == 1, p
    src = fam.render(m, p, "cuda")
    assert "#define XROW(r) ((int64_t)(r) / 128 * 268435456LL + (int64_t)(r) % 128 * 262144LL)" in src
    assert src.count("x + XROW(") >= 3 and "in[0].stride[1] != 262144" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(600)
def test_nvcc_builds_one_cuda_variant_of_every_family(matched, tmp_path):
    """The default suite's share of the build below: every family's variants pass the static
    checks, and one variant of each family (its first mode, at one dtype) builds with nvcc."""
    _nvcc_builds_cuda_template_variants(matched, tmp_path, every=False)


@pytest.mark.exhaustive
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(1200)  # about 25 nvcc builds: minutes on 2 cores
def test_nvcc_builds_every_cuda_template_variant(matched, tmp_path):
    _nvcc_builds_cuda_template_variants(matched, tmp_path, every=True)


def _nvcc_builds_cuda_template_variants(matched, tmp_path, every: bool) -> None:
    from forge_tui.evaluator.build import Builder

    sources = {}
    for cards in matched.values():
        card, fam, _ = cards[0]
        for dtype in ("float32", "bfloat16", "float16"):
            c = _retyped(card, dtype)
            f2, m = match(c)
            if f2 is None:
                continue
            p0 = f2.initial(m, "cuda")
            # the first choice and every one-step move from it (mode changes included)
            variants = [p0] + TemplateProposer().neighbours(f2, m, p0, "cuda")
            for q in variants:
                key = (m.family, dtype, q.get("mode"), describe(m.family, q))
                sources.setdefault(key, f2.render(m, q, "cuda"))
    # anchor-sized shapes whose modes a small card never reaches
    sm = next(c for c, f, m in matched["softmax"] if not m.info["log"])
    gn_card = matched["group_norm"][0][0]
    for c in (_retyped(_reshaped(sm, [512, 262144]), "bfloat16"), _reshaped(sm, [4, 262144]),
              _reshaped(gn_card, [2, 512, 128, 128]), _retyped(_reshaped(gn_card, [1, 512, 256, 256]), "bfloat16"),
              _retyped(_last_positions(sm, 4, 1024, 128, 262144), "bfloat16", "float32")):
        f2, m = match(c)
        p0 = f2.initial(m, "cuda")
        for q in [p0] + TemplateProposer().neighbours(f2, m, p0, "cuda"):
            sources.setdefault((m.family, "anchor-" + str(c.inputs[0].shape) + str(c.inputs[0].stride), q.get("mode"),
                                describe(m.family, q)), f2.render(m, q, "cuda"))
    # ResNet's global average pool at its anchor shape (7x7 rows: the tile modes apply)
    # (the card pooling the two trailing dims: the workload has others, in no fixed order)
    avg = json.loads(next(c for c, f, m in matched["avg_pool"]
                          if len(c.inputs[0].shape) == 4 and m.info["cols"] == numel(c.inputs[0].shape[2:]))
                     .model_dump_json())
    avg["inputs"][0].update(shape=[32, 2048, 7, 7], stride=[2048 * 49, 49, 7, 1])
    avg["outputs"][0].update(shape=[32, 2048, 1, 1], stride=[2048, 1, 1, 1])
    avg["program"]["nodes"][0]["out"][0][0] = [32, 2048, 1, 1]
    f2, m = match(_retyped(Card.model_validate(avg), "float16"))
    p0 = f2.initial(m, "cuda")
    assert p0 == {"mode": "vtile", "threads": 128} and "mean_vtile<TX, TO, 128, 49, true>" in f2.render(m, p0, "cuda")
    for q in [p0] + TemplateProposer().neighbours(f2, m, p0, "cuda"):
        sources.setdefault((m.family, "anchor-7x7", q.get("mode"), describe(m.family, q)), f2.render(m, q, "cuda"))
    # nn.MaxPool2d's module card (values only): its own kernels, without the indices
    pool_mod = next(c for c, f, m in matched["max_pool"] if c.kind == "module")
    for dtype in ("float32", "float16"):
        f2, m = match(_retyped(pool_mod, dtype))
        p0 = f2.initial(m, "cuda")
        for q in [p0] + TemplateProposer().neighbours(f2, m, p0, "cuda"):
            sources.setdefault((m.family, "module-" + dtype, q.get("mode"), describe(m.family, q)),
                               f2.render(m, q, "cuda"))
    assert {k[0] for k in sources} >= FAMILIES
    assert {k[2] for k in sources if k[0] == "softmax"} >= {"regs", "online", "split", "cluster", "stash", "stream",
                                                            "ring"}
    assert {k[2] for k in sources if k[0] == "group_norm"} >= {"split", "cluster", "stash", "stream", "ring"}
    assert {k[2] for k in sources if k[0] == "max_pool"} >= {"thread", "tile", "strip"}
    assert {k[2] for k in sources if k[0] == "avg_pool"} >= {"tile", "vtile", "warp"}
    # the static checks the evaluator runs first must pass every variant (a parser blind spot once
    # rejected every thread-block-cluster kernel as "never launched")
    from forge_tui.evaluator.static_checks import check_source, errors

    flagged = [(k, [str(f) for f in errors(check_source(src, "cuda"))]) for k, src in sources.items()]
    assert not [f for f in flagged if f[1]], [f for f in flagged if f[1]][:3]
    # nvcc builds: every mode of every family (the op and the module card apart) and every dtype or
    # anchor shape of every family at least once; the other variants differ from these only in
    # template constants, and building all of them takes CI's 2 cores too long
    build, modes_seen, dtypes_seen = {}, set(), set()
    for k, src in sources.items():
        mode_key, dtype_key = (k[0], k[2], k[1].startswith("module")), (k[0], k[1])
        if not every:
            mode_key, dtype_key = (k[0],), (k[0],)  # one variant a family
        if mode_key not in modes_seen or dtype_key not in dtypes_seen:
            build[k] = src
            modes_seen.add(mode_key)
            dtypes_seen.add(dtype_key)
    results = Builder("cuda", tmp_path, arch="sm_90").build_many(list(build.values()))
    failed = [(k, r.reason) for k, r in zip(build, results) if not r.ok]
    assert not failed, failed
    assert len(sources) >= 40 and {k[0] for k in build} >= FAMILIES
    if every:
        assert len(build) >= 25 and {(k[0], k[2]) for k in build} == {(k[0], k[2]) for k in sources}


def _bn_reshaped(card: Card, shape: list[int]) -> Card:
    """A batch norm card at another NCHW shape: its input and output, and its per-channel tensors."""
    data = json.loads(card.model_dump_json())
    c0 = data["inputs"][0]["shape"][1]
    stride = [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1]
    data["inputs"][0].update(shape=list(shape), stride=stride)
    data["outputs"][0].update(shape=list(shape), stride=stride)
    for t in data["inputs"][1:]:
        if t["shape"] == [c0]:
            t.update(shape=[shape[1]], stride=[1])
    out = data["program"]["nodes"][0]["out"]
    out[0][0] = list(shape)
    return Card.model_validate(data)


def test_batch_norm_runs_flat_over_small_planes(matched):
    """ResNet's batch norms at 28x28, 14x14 and 7x7: a block a (n, c) plane left most of its threads idle
    and ran 8 waves of tiny blocks (18-30 µs a call in place on the H200 for a 1.5-6 µs floor); the
    first choice on the GPU is the flat mode, a few waves of blocks striding over the whole tensor,
    with vectors that may straddle two planes where the plane's size does not divide them."""
    bn = next(c for c, f, m in matched["batch_norm"] if c.kind == "module")
    for shape, in_plane in (([32, 2048, 7, 7], "false"), ([32, 256, 14, 14], "false"), ([32, 128, 28, 28], "true")):
        fam, m = match(_retyped(_bn_reshaped(bn, shape), "float16"))
        p = fam.initial(m, "cuda")
        assert p == {"mode": "flat", "threads": 256, "vec": 8, "unroll": 2}, p
        src = fam.render(m, p, "cuda")
        wave = DEFAULT_DEVICE.sms * DEFAULT_DEVICE.max_threads_per_sm // 256
        grid = min(-(-numel(shape) // (256 * 8 * 2)), 4 * wave)
        assert f"bn_flat<TX, TO, TP, 256, 8, 2, C, HW, {in_plane}><<<{grid}, 256, 0, s>>>" in src, src[-1500:]
        # the plane mode keeps a vector in one plane: 8 does not divide 49
        assert fam.valid(m, {**p, "mode": "plane"}, "cuda") == (shape[2] * shape[3] % 8 == 0)
        assert any(q["mode"] == "plane" for q in TemplateProposer().neighbours(fam, m, p, "cuda"))
