"""The template proposer on the device machine: for each anchor shape (../shared/anchors.md), the
paper's families and decode-sized shapes, profile a one-op workload, run a template search of up
to N evaluations, and report eager, torch.compile and our best, paired speedups with spread, the
fraction of the roofline floor reached, the time of a device copy moving the same bytes (the floor
a kernel can reach at sizes where launch and ramp-up dominate) and the evaluations it took.

    python bench/templates_bench.py [--evals 8] [--only NAME ...] [--case-wall S] [--run-timeout S]

Every evaluation is printed as it lands (status, speedup over eager, move, reason), so a run cut short still shows
where its time went; --case-wall bounds one case's search, --run-timeout a candidate's phase.

Writes $OUT/templates.json after every case (a run cut short keeps what it finished) and prints a
table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name -> (dtype, module body using torch/F, input shapes), the card's target (or module prefix)
CASES = {
    "softmax_fp32_65536x1024": ("float32", "return torch.softmax(x, -1)", [(65536, 1024)], "aten._softmax"),
    "softmax_bf16_16384x4096": ("bfloat16", "return torch.softmax(x, -1)", [(16384, 4096)], "aten._softmax"),
    "softmax_bf16in_fp32out_512x262144": ("bfloat16", "MODULE:Up", [(512, 262144)], "module:Up"),
    "layer_norm_bf16_16384x4096": ("bfloat16", "return F.layer_norm(x, x.shape[-1:], self.w, self.b, 1e-5)",
                                   [(16384, 4096)], "aten.native_layer_norm"),
    "group_norm_fp32_2x512x128x128": ("float32", "return F.group_norm(x, 32, self.gw, self.gb, 1e-5)",
                                      [(2, 512, 128, 128)], "aten.native_group_norm"),
    "group_norm_bf16_1x512x256x256": ("bfloat16", "return F.group_norm(x, 32, self.gw, self.gb, 1e-5)",
                                      [(1, 512, 256, 256)], "aten.native_group_norm"),
    "rms_norm_hf_bf16_16384x4096": ("bfloat16", "MODULE:RMSNorm", [(16384, 4096)], "module:RMSNorm"),
    "gelu_tanh_bf16_16384x16384": ("bfloat16", "return F.gelu(x, approximate='tanh')", [(16384, 16384)], "aten.gelu"),
    "silu_mul_bf16_16384x11008": ("bfloat16", "MODULE:SiluMul", [(16384, 11008), (16384, 11008)], "module:SiluMul"),
    "batch_norm_fp32_64x256x56x56": ("float32", "return F.batch_norm(x, self.rm, self.rv, self.bw, self.bb, False, 0.1, 1e-5)",
                                     [(64, 256, 56, 56)], "aten.native_batch_norm"),
    "add_fp16_32x256x56x56 (ResNet residual)": ("float16", "return x + y", [(32, 256, 56, 56), (32, 256, 56, 56)],
                                                "aten.add"),
    "adaptive_avgpool_fp16_32x2048x7x7": ("float16", "return F.adaptive_avg_pool2d(x, 1)", [(32, 2048, 7, 7)], "aten.mean"),
    "maxpool_fp16_32x64x112x112": ("float16", "return F.max_pool2d(x, 3, 2, 1)", [(32, 64, 112, 112)],
                                   "aten.max_pool2d_with_indices"),
    # a 2x2/2 pool (VGG, U-Net): no strip mode, windows from global memory or a shared-memory tile
    "maxpool2x2_fp16_32x64x112x112": ("float16", "return F.max_pool2d(x, 2, 2)", [(32, 64, 112, 112)],
                                      "aten.max_pool2d_with_indices"),
    # ResNet-50's stem pool is an nn.MaxPool2d: the module returns the values and drops the indices
    "maxpool_module_fp16_32x64x112x112": ("float16", "MODULE:MaxPool2d", [(32, 64, 112, 112)], "module:MaxPool2d"),
    "decode_softmax_bf16in_fp32out_4x262144": ("bfloat16", "MODULE:Up", [(4, 262144)], "module:Up"),
    "decode_rms_norm_bf16_4x1536": ("bfloat16", "MODULE:RMSNorm", [(4, 1536)], "module:RMSNorm"),
    "decode_silu_mul_bf16_4x11008": ("bfloat16", "MODULE:SiluMul", [(4, 11008), (4, 11008)], "module:SiluMul"),
}

WORKLOAD = '''
import torch
import torch.nn.functional as F

DTYPE = torch.{dtype}


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(n))
        self.variance_epsilon = 1e-6

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(v + self.variance_epsilon)
        return self.weight * h.to(dt)


class SiluMul(torch.nn.Module):
    def forward(self, a, b):
        return F.silu(a) * b


class Up(torch.nn.Module):
    def forward(self, x):
        return F.softmax(x, dim=-1, dtype=torch.float32)


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c = {channels}
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn({last}))
        self.b = torch.nn.Parameter(0.1 * torch.randn({last}))
        self.gw = torch.nn.Parameter(1 + 0.1 * torch.randn(c))
        self.gb = torch.nn.Parameter(0.1 * torch.randn(c))
        self.bw = torch.nn.Parameter(1 + 0.1 * torch.randn(c))
        self.bb = torch.nn.Parameter(0.1 * torch.randn(c))
        self.register_buffer("rm", 0.1 * torch.randn(c))
        self.register_buffer("rv", 0.5 + torch.rand(c))
        self.inner = {inner}

    def forward(self, *args):
        if self.inner is not None:
            return self.inner(*args)
        x = args[0]
        y = args[1] if len(args) > 1 else None
        {body}


def get_model(device="cpu"):
    with torch.device(device):
        return M()


def get_inputs(device="cpu"):
    with torch.device(device):
        return [torch.randn(*s) for s in {shapes}]
'''


def workload_source(dtype: str, body: str, shapes: list) -> str:
    inner = "None"
    if body.startswith("MODULE:"):
        name = body.split(":", 1)[1]
        inner = {"RMSNorm": f"RMSNorm({shapes[0][-1]})",
                 "MaxPool2d": "torch.nn.MaxPool2d(3, 2, 1)"}.get(name, f"{name}()")
        body = "return None"
    channels = shapes[0][1] if len(shapes[0]) == 4 else 1
    return WORKLOAD.format(dtype=dtype, body=body, shapes=shapes, channels=channels, last=shapes[0][-1], inner=inner)


def same_size_copy_us(nbytes: int) -> float:
    """Median time (µs) of a device copy that reads and writes as many bytes as the card moves
    (nbytes / 2 each way), timed like the candidates (cold L2, launch shield): at small sizes,
    where launch and ramp-up dominate, this is the floor a kernel can actually reach."""
    import torch

    from forge_tui.timing import Timer

    n = max(16, nbytes // 2 // 16 * 16)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stats, _, _ = Timer("cuda", warmup=3, repeats=30).time({"copy": lambda: dst.copy_(src)})
    return stats["copy"].median


def main() -> int:
    import torch

    from forge_tui.config import parse_config
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.search.store import SearchStore
    from forge_tui.templates.proposer import TemplateProposer
    from forge_tui.workspace import profile_into_workspace

    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=8)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--case-wall", type=float, default=3600.0, help="wall-clock limit of one case's search (s)")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="evaluator limit per phase (s)")
    args = ap.parse_args()
    from forge_tui.search.events import EventBus

    t_start = time.time()
    import faulthandler

    faulthandler.dump_traceback_later(240, repeat=True)  # a stuck run shows where it is stuck

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    def on_event(ev) -> None:
        d = ev.data
        if ev.kind == "node_added" and d.get("parent"):
            log(f"  {ev.node}: {d.get('status')} x{d.get('speedup') or 0:.2f} eager  {d.get('move', '')}  "
                f"{(d.get('reason') or '')[:240]}")

    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-tbench-"))
    report = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/templates_bench.py " + " ".join(sys.argv[1:]), "cases": {}}
    cfg_text = "[timing]\nwarmup = 3\nrepeats = 10\n[profile]\nsamples_per_card = 1\nmax_sample_mib = 1200.0\n"
    (tmp / "forge.toml").write_text(cfg_text)
    cfg = parse_config({"timing": {"warmup": 3, "repeats": 10},
                        "evaluator": {"run_timeout_s": args.run_timeout, "random_sets": 3},
                        "search": {"max_evals": args.evals, "evals_per_card": args.evals, "parallel": 3,
                                   "max_wall_s": args.case_wall,
                                   "min_gain": 0.0, "floor_fraction": 0.97}})
    # --only runs the named cases in the order given (the first case also pays the machine's cold
    # start: torch.compile's first compilation in every worker)
    names = [n for o in args.only for n in CASES if o in n] if args.only else list(CASES)
    for name in dict.fromkeys(names):
        dtype, body, shapes, target = CASES[name]
        t0 = time.time()
        wl = tmp / f"w_{len(report['cases'])}.py"
        wl.write_text(workload_source(dtype, body, shapes))
        case: dict = {"dtype": dtype, "shapes": shapes}
        log(f"{name}: profiling")
        try:
            ws, res = profile_into_workspace(wl, tmp / f"ws_{len(report['cases'])}", device="cuda",
                                             config_path=tmp / "forge.toml")
            from forge_tui.templates.registry import match

            cards = [c for c in ws.cards() if c.target.startswith(target)] or \
                [c for c in ws.cards() if match(c)[0] is not None]
            card = max(cards, key=lambda c: c.bytes)
            case.update(card=card.id, eager_profile_us=card.time_us, floor_us=card.floor_us,
                        copy_us=same_size_copy_us(card.bytes))
            log(f"{name}: searching {card.id} (eager {card.time_us:.1f} µs in the profile, floor {card.floor_us:.1f} µs)")
            pool = LocalEvalPool(ws.store, ws.cache, cfg, backend="cuda")
            bus = EventBus()
            bus.subscribe(on_event)
            try:
                summary = Search(ws, cfg, TemplateProposer(), pool, cards=[card.id], bus=bus).run()
            finally:
                pool.close()
            with ws.git() as repo:
                store = SearchStore(repo)
                nodes = [r for r in store.load().nodes if r.card == card.id and r.node != "root"]
                results = []
                for r in nodes:
                    res_json = json.loads(store.read(r.commit, "result.json") or b"{}")
                    t = res_json.get("timing") or {}
                    results.append({"node": r.node, "seq": r.seq, "status": r.status, "move": r.move,
                                    "reason": r.reason[:300], "speedup_vs_eager": res_json.get("speedup_vs_eager"),
                                    "speedup_vs_compile": res_json.get("speedup_vs_compile"),
                                    "time_us": res_json.get("time_us"),
                                    "eager_us": (t.get("eager") or {}).get("median"),
                                    "compile_us": (t.get("compile") or {}).get("median"),
                                    "sp_q1": (t.get("speedup_vs_eager") or {}).get("q1"),
                                    "sp_q3": (t.get("speedup_vs_eager") or {}).get("q3"),
                                    "spc_q1": (t.get("speedup_vs_compile") or {}).get("q1"),
                                    "spc_q3": (t.get("speedup_vs_compile") or {}).get("q3"),
                                    "floor_us": t.get("floor_us"), "fraction_of_floor": t.get("fraction_of_floor"),
                                    "noise": t.get("noise"), "compile_note": t.get("compile_note")})
            ok = [r for r in results if r["status"] == "passed" and r["speedup_vs_eager"]]
            best = max(ok, key=lambda r: r["speedup_vs_eager"]) if ok else None
            order = sorted(results, key=lambda r: r["seq"])
            case.update(nodes=results, best=best, stopped=summary.stopped,
                        evals_to_best=(1 + [r["node"] for r in order].index(best["node"])) if best else None,
                        wall_s=time.time() - t0)
        except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
            import traceback

            case["error"] = f"{type(exc).__name__}: {exc}"
            case["traceback"] = traceback.format_exc()[-2000:]
        report["cases"][name] = case
        (out / "templates.json").write_text(json.dumps(report, indent=1, default=str))
        b = case.get("best")
        print(f"[{time.strftime('%H:%M:%S')}] {name}: " + (
            f"best {b['speedup_vs_eager']:.2f}x eager, {b['speedup_vs_compile'] or float('nan'):.2f}x compile, "
            f"{100 * (b['fraction_of_floor'] or 0):.0f}% of floor, {100 * case['copy_us'] / b['time_us']:.0f}% of a "
            f"same-size copy ({b['move']})" if b else
            f"no passing candidate: {case.get('error') or [r['reason'][:160] for r in case.get('nodes', [])][:2]}"),
            flush=True)
    print(f"\n{'case':42s} {'eager µs':>9s} {'compile µs':>10s} {'ours µs':>8s} {'vs eager':>9s} {'vs compile':>10s} "
          f"{'%floor':>7s} {'copy µs':>8s} {'%copy':>6s} {'evals':>5s}")
    for name, c in report["cases"].items():
        b = c.get("best")
        if not b:
            print(f"{name:42s} {'-':>9s} {'-':>10s} {'-':>8s}  {c.get('error', 'no passing candidate')[:60]}")
            continue
        print(f"{name:42s} {b['eager_us'] or 0:9.1f} {b['compile_us'] or float('nan'):10.1f} {b['time_us']:8.1f} "
              f"{b['speedup_vs_eager']:8.2f}x {b['speedup_vs_compile'] or float('nan'):9.2f}x "
              f"{100 * (b['fraction_of_floor'] or 0):6.0f}% {c['copy_us']:8.1f} {100 * c['copy_us'] / b['time_us']:5.0f}% "
              f"{c['evals_to_best']:5d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
