"""Answers (1): does the routed-experts grouped pass (``forge_tui/runtime/experts.py``) run on this
GPU's torch (``torch._grouped_mm`` per dtype), match the bundled moe example's block and Hugging
Face's Qwen3-MoE and Mixtral blocks, capture in a CUDA graph, and how much faster is it, per block
and for the whole moe forward? (2, ``--sweep``) From how many tokens does it pay, for the moe
example's block (64 experts top-8, bf16), a Mixtral-style one (8 experts top-2, w1/w3/w2, fp16)
and a Qwen1.5-MoE-style one (60 experts top-4 and a gated shared expert, bf16)?

Run: ``python bench/lab/moe_grouped_probe.py`` (GPU). Prints a table; JSON to ``$OUT`` if set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from forge_tui.runtime.experts import Stacked, check, find_blocks, returns_of, routed  # noqa: E402


def med_ms(fn, reps=15, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts), max(ts)


def _grouped_forward(m, st, b):
    return lambda x: routed(x, m.gate.weight, st, b, True, False)


def probe_dtypes(out):
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(100, 64, device="cuda", dtype=dt)
        w = torch.randn(4, 32, 64, device="cuda", dtype=dt)
        offs = torch.tensor([10, 10, 60, 100], device="cuda", dtype=torch.int32)
        try:
            y = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
            ref = torch.cat([a[0:10] @ w[0].T, a[10:10] @ w[1].T, a[10:60] @ w[2].T, a[60:100] @ w[3].T])
            out[f"grouped_mm {dt}"] = f"ok, max diff {float((y.float() - ref.float()).abs().max()):.3g}"
        except Exception as exc:  # noqa: BLE001
            out[f"grouped_mm {dt}"] = f"error: {str(exc).splitlines()[0][:160]}"
        print(f"grouped_mm {dt}: {out[f'grouped_mm {dt}']}", flush=True)


def block_case(name, model, x, out):
    blocks, why = find_blocks(model)
    print(f"{name}: blocks {[b.path for b in blocks]} why {why}", flush=True)
    if not blocks:
        out[name] = {"why": why}
        return
    b = blocks[0]
    m = model.get_submodule(b.path)
    with torch.no_grad():
        ref = m(x)
        rets = returns_of(ref, b, x)
        st = Stacked(b, m, repoint=False)
        res = {}
        for norm in ((b.norm,) if b.norm is not None else (True, False)):
            y = routed(x, m.gate.weight, st, b, norm, rets == "tensor_logits")
            res[f"norm={norm}"] = check(y, ref) or "match"
            r0 = ref[0] if isinstance(ref, tuple) else ref
            y0 = y[0] if isinstance(y, tuple) else y
            res[f"norm={norm} max abs diff"] = float((y0.float() - r0.float()).abs().max())
        norm = b.norm if b.norm is not None else True
        e_ms = med_ms(lambda: m(x))
        g_ms = med_ms(lambda: routed(x, m.gate.weight, st, b, norm, rets == "tensor_logits"))
        res.update(block=b.path, act=b.act, returns=rets, eager_ms=e_ms, grouped_ms=g_ms, speedup=e_ms[0] / g_ms[0])
        # CUDA graph capture of the grouped pass
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    routed(x, m.gate.weight, st, b, norm, rets == "tensor_logits")
            torch.cuda.current_stream().wait_stream(s)
            gph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gph):
                yg = routed(x, m.gate.weight, st, b, norm, rets == "tensor_logits")
            gph.replay()
            torch.cuda.synchronize()
            res["graph"] = check(yg, ref) or "captured, match"
            res["graph_ms"] = med_ms(gph.replay)
        except Exception as exc:  # noqa: BLE001
            res["graph"] = f"error: {str(exc).splitlines()[0][:200]}"
    out[name] = res
    print(f"{name}: {json.dumps(res, default=str)}", flush=True)


class _Expert(torch.nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.w1 = torch.nn.Linear(h, i, bias=False)
        self.w3 = torch.nn.Linear(h, i, bias=False)
        self.w2 = torch.nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class _MixtralLike(torch.nn.Module):
    """Mixtral's eager block as transformers 4.x writes it: softmax, top-2, renormalised, a loop."""

    def __init__(self, h=4096, i=14336, e=8, k=2):
        super().__init__()
        self.num_experts_per_tok = k
        self.gate = torch.nn.Linear(h, e, bias=False)
        self.experts = torch.nn.ModuleList(_Expert(h, i) for _ in range(e))

    def forward(self, x):
        b, s, h = x.shape
        x = x.view(-1, h)
        logits = self.gate(x)
        w = torch.nn.functional.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, self.num_experts_per_tok, dim=-1)
        w /= w.sum(dim=-1, keepdim=True)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(sel, num_classes=len(self.experts)).permute(2, 1, 0)
        for e in range(len(self.experts)):
            idx, top_x = torch.where(mask[e])
            cur = x[None, top_x].reshape(-1, h)
            out.index_add_(0, top_x, (self.experts[e](cur) * w[top_x, idx, None]).to(x.dtype))
        return out.reshape(b, s, h), logits


class _Qwen2MoeLike(torch.nn.Module):
    """Qwen1.5-MoE-A2.7B's block as transformers 4.x writes it: 60 experts top-4 without
    renormalising, and a shared expert scaled by a sigmoid gate."""

    def __init__(self, h=2048, i=1408, shared_i=5632, e=60, k=4):
        super().__init__()
        from forge_tui.examples._decoder_parts import GatedMLP

        self.num_experts, self.top_k, self.norm_topk_prob = e, k, False
        self.gate = torch.nn.Linear(h, e, bias=False)
        self.experts = torch.nn.ModuleList(GatedMLP(h, i, "silu") for _ in range(e))
        self.shared_expert = GatedMLP(h, shared_i, "silu")
        self.shared_expert_gate = torch.nn.Linear(h, 1, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        x = x.view(-1, h)
        logits = self.gate(x)
        w = torch.nn.functional.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, self.top_k, dim=-1)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(sel, num_classes=self.num_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit.flatten().tolist():
            idx, top_x = torch.where(mask[e])
            cur = x[None, top_x].reshape(-1, h)
            out.index_add_(0, top_x, (self.experts[e](cur) * w[top_x, idx, None]).to(x.dtype))
        shared = torch.nn.functional.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (out + shared).reshape(b, s, h), logits


def _on_cuda(cls):
    with torch.device("cuda"):  # random init of large weights is fast there
        return cls()


def sweep(out):
    from forge_tui.examples import moe

    cases = {"moe example block (64 experts top-8, 2048 -> 768, bf16)":
             lambda: moe.get_model("cuda").to(torch.bfloat16).eval().layers[0].mlp,
             "Mixtral-style block (8 experts top-2, 4096 -> 14336, fp16)":
             lambda: _on_cuda(_MixtralLike).to(torch.float16).eval(),
             "Qwen1.5-MoE-style block (60 experts top-4 + a gated shared expert, 2048 -> 1408, bf16)":
             lambda: _on_cuda(_Qwen2MoeLike).to(torch.bfloat16).eval()}
    for name, make in cases.items():
        torch.manual_seed(0)
        out[f"sweep: {name}"] = _sweep_block(name, make())
        torch.cuda.empty_cache()


def _sweep_block(name, blk):
    holder = torch.nn.Module()
    holder.add_module("mlp", blk)
    (b,), _ = find_blocks(holder)
    dt = next(blk.parameters()).dtype
    st = Stacked(b, blk, repoint=False)
    rows = []
    with torch.no_grad():
        norm = b.norm if b.norm is not None else True
        for tokens in (1, 8, 64, 512, 4096):
            x = torch.randn(1, tokens, b.hidden, device="cuda", dtype=dt)
            ref = blk(x)
            logits = returns_of(ref, b, x) == "tensor_logits"
            y = routed(x, blk.gate.weight, st, b, norm, logits, blk)
            e_ms = med_ms(lambda x=x: blk(x))
            g_ms = med_ms(lambda x=x, lg=logits: routed(x, blk.gate.weight, st, b, norm, lg, blk))
            rows.append({"tokens": tokens, "eager_ms": e_ms[0], "grouped_ms": g_ms[0], "speedup": e_ms[0] / g_ms[0],
                         "check": check(y, ref) or "match"})
            print(f"{name} tokens {tokens}: {rows[-1]}", flush=True)
    return rows


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if "--sweep" in sys.argv:
        sweep(out)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "moe_grouped_sweep.json").write_text(json.dumps(out, indent=1, default=str))
        return
    probe_dtypes(out)
    from forge_tui.examples import moe

    model = moe.get_model("cuda").to(torch.bfloat16).eval()
    inputs = moe.get_inputs("cuda")
    cap = {}
    blk = model.get_submodule(find_blocks(model)[0][0].path)
    h = blk.register_forward_pre_hook(lambda mod, args: cap.setdefault("x", args[0].detach().clone()))
    with torch.no_grad():
        model(*inputs)
    h.remove()
    block_case("moe example block 4x1024x2048 bf16", model, cap["x"], out)

    # the whole forward, every block's forward replaced by the grouped pass (weights stacked, repointed)
    blocks, _ = find_blocks(model)
    with torch.no_grad():
        ref = model(*inputs)
        e_ms = med_ms(lambda: model(*inputs), reps=7, warm=2)
        stacks = []
        for b in blocks:
            m = model.get_submodule(b.path)
            st = Stacked(b, m, repoint=True)
            stacks.append(st)
            m.forward = _grouped_forward(m, st, b)
        y = model(*inputs)
        y, ref = (y[0], ref[0]) if isinstance(y, tuple) else (y, ref)
        g_ms = med_ms(lambda: model(*inputs), reps=7, warm=2)
        e2_ms = None
        for b in blocks:
            del model.get_submodule(b.path).__dict__["forward"]
        e2_ms = med_ms(lambda: model(*inputs), reps=7, warm=2)
    out["moe forward"] = {"eager_ms": e_ms, "grouped_ms": g_ms, "eager_after_ms": e2_ms,
                          "speedup": e_ms[0] / g_ms[0], "check": check(y, ref) or "match",
                          "max_abs_diff": float((y.float() - ref.float()).abs().max()),
                          "mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(f"moe forward: {json.dumps(out['moe forward'], default=str)}", flush=True)
    model = stacks = None
    torch.cuda.empty_cache()

    try:
        import transformers
        from transformers import MixtralConfig, Qwen3MoeConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        out["transformers"] = transformers.__version__
        torch.manual_seed(0)
        cfg = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=64, num_experts_per_tok=8,
                             norm_topk_prob=True)
        blk = Qwen3MoeSparseMoeBlock(cfg).to("cuda", torch.bfloat16).eval()
        holder = torch.nn.Module()
        holder.add_module("mlp", blk)
        x = torch.randn(4, 1024, 2048, device="cuda", dtype=torch.bfloat16)
        block_case("HF Qwen3MoeSparseMoeBlock 4x1024x2048 bf16", holder, x, out)
        cfg = MixtralConfig(hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2)
        blk = MixtralSparseMoeBlock(cfg).to("cuda", torch.bfloat16).eval()
        holder = torch.nn.Module()
        holder.add_module("block_sparse_moe", blk)
        x = torch.randn(4, 1024, 1024, device="cuda", dtype=torch.bfloat16)
        block_case("HF MixtralSparseMoeBlock 4x1024x1024 bf16", holder, x, out)
    except Exception:  # noqa: BLE001
        out["transformers error"] = traceback.format_exc()[-600:]
        print(out["transformers error"], flush=True)

    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "moe_grouped_probe.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
