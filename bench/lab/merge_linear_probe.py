"""Answers: do sibling linears that read one input (attention's q/k/v projections, a gated MLP's
gate and up projections) run faster on the H200 as one batched product over that input, at the
shapes of the bundled diffusion and decoder examples; does ``torch.bmm`` read an expanded
(stride-0) input without copying it; and how far from the separate linears' outputs is the
batched product's (max abs difference, bit-equal or not)?

Four ways per case: the separate ``F.linear`` calls; the linears as ``nn.Linear`` modules served by
forge's runtime (``runtime/merge.py``: guards, the product at the first call, the stored slices
after; against the same modules unserved, ``modules``); ``bmm`` (``baddbmm`` with a bias) over the
input expanded to [G, M, K], every output contiguous; one ``mm`` into [M, G x N] returning column
slices (not contiguous, for reference). Each timed two ways: one call then a device sync (host
clock, median of 30), and 50 calls back to back (the host-bound regime of an op-by-op forward).

Run: ``python bench/lab/merge_linear_probe.py`` (GPU). Prints a table; JSON to ``$OUT`` if set.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

CASES = [
    # name, input shape, transposed view, members, in, out, bias, dtype
    ("diffusion vae_attn q/k/v", (1, 16384, 512), True, 3, 512, 512, True, torch.float16),
    ("diffusion attn1 q/k/v", (2, 4096, 320), False, 3, 320, 320, False, torch.float16),
    ("diffusion attn2 k/v (context)", (2, 77, 768), False, 2, 768, 320, False, torch.float16),
    ("decoder k/v", (4, 1024, 1536), False, 2, 1536, 512, False, torch.bfloat16),
    ("decoder gate/up", (4, 1024, 1536), False, 2, 1536, 6144, False, torch.bfloat16),
]


def timed(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    one = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one.append((time.perf_counter() - t0) * 1e6)
    pipe = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        pipe.append((time.perf_counter() - t0) * 1e6 / 50)
    return statistics.median(one), statistics.median(pipe)


def kernels_of(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def probe_case(name, shape, trans, g, k, n, bias, dt) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    if trans:
        x = torch.randn(shape[0], shape[2], shape[1], device="cuda", dtype=dt, generator=gen).transpose(1, 2)
    else:
        x = torch.randn(*shape, device="cuda", dtype=dt, generator=gen)
    w = torch.randn(g, n, k, device="cuda", dtype=dt, generator=gen) * k ** -0.5
    b = torch.randn(g, n, device="cuda", dtype=dt, generator=gen) * 0.1 if bias else None

    def separate():
        return [F.linear(x, w[i], b[i] if b is not None else None) for i in range(g)]

    def batched():
        x2 = x.reshape(-1, k)
        xe = x2.unsqueeze(0).expand(g, x2.shape[0], k)
        wt = w.transpose(1, 2)
        out = torch.baddbmm(b.unsqueeze(1), xe, wt) if b is not None else torch.bmm(xe, wt)
        return [out[i].view(*x.shape[:-1], n) for i in range(g)]

    from torch import nn

    from forge_tui.runtime.merge import Group, Member, MergeGuard, Stacked
    from forge_tui.runtime.status import StatusBoard

    def holder():
        h = nn.Module()
        for i in range(g):
            lin = nn.Linear(k, n, bias=bias, device="cuda", dtype=dt)
            with torch.no_grad():
                lin.weight.copy_(w[i])
                if bias:
                    lin.bias.copy_(b[i])
            h.add_module(f"l{i}", lin)
        return h

    plain, served_h = holder(), holder()
    mods = [served_h.get_submodule(f"l{i}") for i in range(g)]
    guard = MergeGuard("probe", "probe", dt, "cuda", StatusBoard(), 0)
    group = Group(guard, mods, Stacked([(served_h, f"l{i}") for i in range(g)], repoint=True))
    for i, m in enumerate(mods):
        m.forward = Member(group, i)

    def modules():
        return [plain.get_submodule(f"l{i}")(x) for i in range(g)]

    def runtime():
        return [m(x) for m in mods]

    def concat():
        y = F.linear(x, w.reshape(g * n, k), b.reshape(-1) if b is not None else None)
        return [y[..., i * n:(i + 1) * n] for i in range(g)]

    ref = separate()
    row = {"case": name, "shape": list(shape), "transposed": trans, "members": g, "in": k, "out": n,
           "bias": bias, "dtype": str(dt).removeprefix("torch.")}
    ways = (("separate", separate), ("batched", batched), ("concat", concat), ("modules", modules),
            ("runtime", runtime))
    for label, fn in ways:
        got = fn()
        diff = max((a.float() - r.float()).abs().max().item() for a, r in zip(got, ref))
        equal = all(torch.equal(a, r) for a, r in zip(got, ref))
        one, pipe = timed(fn)
        ks = kernels_of(fn)
        row[label] = {"one_us": round(one, 1), "pipelined_us": round(pipe, 1), "max_abs_diff": diff,
                      "bit_equal": equal, "kernels": len(ks), "kernel_names": ks,
                      "contiguous": all(t.is_contiguous() for t in got)}
    row["runtime_served"] = guard.status.served
    row["runtime_fallbacks"] = dict(guard.status.fallbacks)
    return row


def main() -> int:
    with torch.no_grad():  # as inference runs (with gradients on, the served path falls back)
        rows = [probe_case(*case) for case in CASES]
    print(f"{'case':34s} {'way':9s} {'1 call µs':>10s} {'50 calls µs/call':>17s} {'kernels':>8s} "
          f"{'max diff':>9s} {'equal':>6s} contig")
    for r in rows:
        for label in ("separate", "batched", "concat", "modules", "runtime"):
            v = r[label]
            print(f"{r['case']:34s} {label:9s} {v['one_us']:10.1f} {v['pipelined_us']:17.1f} {v['kernels']:8d} "
                  f"{v['max_abs_diff']:9.2e} {str(v['bit_equal']):>6s} {v['contiguous']}")
        print(f"{'':34s} kernels of batched: {r['batched']['kernel_names']}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "merge_linear_probe.json"), "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
