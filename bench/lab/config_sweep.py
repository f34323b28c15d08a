"""Answers: which of a few chosen configurations of a template family is fastest on a bench case,
timed side by side, and how close does each come to moving the card's bytes? Used to choose the
families' first configurations and moves, not as evidence.

For each case, profile its one-op workload (bench/templates_bench.py's CASES), render and build
every listed configuration (overrides on the family's first choice), check each one's output on one
random input set against the PyTorch reference, and time them interleaved with eager, a device copy
of the same bytes and the byte-moving probe of ncu_probe.py (every input of the card read and every
output written, nothing else: its read/write mix), with a cold L2 and the launch shield
(forge_tui.timing.Timer).

    python bench/lab/config_sweep.py [--only NAME ...] [--repeats 20] [--extra 'CASE={"mode": "ring"}' ...]

Not evidence: it runs every candidate in this process (a crashing kernel ends the sweep), checks one
input set, and does not time torch.compile. A configuration it favours is confirmed by a
bench/templates_bench.py search run, which goes through the full evaluator.

Prints a table per case and writes $OUT/config_sweep.json. What it found: docs/runs/issue-05-run-f.md
and issue-05-run-g.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # templates_bench: the cases
sys.path.insert(0, str(ROOT / "bench" / "lab"))  # ncu_probe: the byte-moving probe

# case (templates_bench.CASES) -> parameter overrides on the family's first configuration ({} is
# the first configuration itself)
SWEEPS = {
    "softmax_bf16in_fp32out_512x262144": [
        {}, {"vec": 8}, {"vec": 8, "tpr": 256}, {"vec": 8, "bps": 3}, {"mode": "online"}, {"mode": "online", "vec": 8},
    ],
    "group_norm_fp32_2x512x128x128": [
        {}, {"bps": 2}, {"bps": 4, "threads": 256}, {"load": "bulk"}, {"mode": "stash", "cl": 8, "threads": 1024, "bps": 2},
    ],
    "group_norm_bf16_1x512x256x256": [
        {}, {"bps": 3}, {"mode": "split", "chunk": 16384, "threads": 256, "order": "reverse"},
    ],
    "adaptive_avgpool_fp16_32x2048x7x7": [
        {}, {"mode": "tile", "threads": 64}, {"mode": "vtile", "threads": 64}, {"mode": "vtile", "threads": 256},
    ],
    "maxpool_fp16_32x64x112x112": [{}, {"mode": "thread", "owv": 2, "threads": 128}],
    "layer_norm_bf16_16384x4096": [{}, {"tpr": 256}, {"tpr": 128, "rpb": 2}],
}
# every other case of templates_bench.py: its first configuration


def main() -> int:
    import templates_bench as tb
    import torch
    from ncu_probe import probe_source

    from forge_tui.compare import compare
    from forge_tui.evaluator.build import Builder
    from forge_tui.inputs import random_inputs
    from forge_tui.kernel_abi import Library, alloc_outputs, card_scalars, workspace_for
    from forge_tui.kernels.family import describe
    from forge_tui.program import bind_program
    from forge_tui.templates.registry import match
    from forge_tui.timing import Timer, paired_ratio
    from forge_tui.workspace import profile_into_workspace

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="cases whose names contain one of these, in that order")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--extra", nargs="*", default=[],
                    help="CASE_SUBSTRING=JSON: one more configuration (overrides) for the matching cases")
    args = ap.parse_args()
    sweeps = {k: list(SWEEPS.get(k, [{}])) for k in tb.CASES}
    for item in args.extra:
        key, _, text = item.partition("=")
        for name in tb.CASES:
            if key in name:
                sweeps.setdefault(name, [{}]).append(json.loads(text))
    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-sweep-"))
    (tmp / "forge.toml").write_text("[timing]\nwarmup = 1\nrepeats = 2\n[profile]\nsamples_per_card = 1\n"
                                    "max_sample_mib = 1200.0\n")
    builder = Builder("cuda", tmp / "build", arch="sm_90")
    timer = Timer("cuda", warmup=3, repeats=args.repeats)
    report = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/lab/config_sweep.py " + " ".join(sys.argv[1:]), "cases": {}}
    names = [n for o in args.only for n in sweeps if o in n] if args.only else list(sweeps)
    for ci, name in enumerate(dict.fromkeys(names)):
        t0 = time.time()
        dtype, body, shapes, target = tb.CASES[name]
        wl = tmp / f"w_{ci}.py"
        wl.write_text(tb.workload_source(dtype, body, shapes))
        ws, _ = profile_into_workspace(wl, tmp / f"ws_{ci}", device="cuda", config_path=tmp / "forge.toml")
        cards = [c for c in ws.cards() if c.target.startswith(target)] or \
            [c for c in ws.cards() if match(c)[0] is not None]  # (as templates_bench.py picks the card)
        card = max(cards, key=lambda c: c.bytes)
        fam, m = match(card)
        p0 = fam.initial(m, "cuda")
        rel = getattr(fam, "relevant", lambda q: q)
        configs, seen = [], set()
        for over in sweeps[name]:
            p = {**p0, **over}
            label = describe(m.family, rel(p))
            if label in seen:
                continue
            seen.add(label)
            if not fam.valid(m, p, "cuda"):
                print(f"{name}: skip invalid {label}", flush=True)
                continue
            configs.append((label + (" (first)" if not over else ""), fam.render(m, p, "cuda")))
        builds = builder.build_many([src for _, src in configs] + [probe_source(card)])
        probe_build = builds.pop()
        ins = random_inputs(card, "cuda", seed=1)
        scalars = card_scalars(card.program)
        eager = bind_program(card.program, ins, "cuda")
        with torch.no_grad():
            ref = [t.clone() for t in eager()]
        fns, rows = {"eager": eager}, []
        for (label, _), b in zip(configs, builds):
            row = {"config": label}
            rows.append(row)
            if not b.ok:
                row["error"] = f"build: {b.reason[:300]}"
                continue
            row["registers"] = max([k.get("registers") or 0 for k in (b.resources or {}).values()] or [0])
            lib = Library(b.library)
            outs = alloc_outputs(card.outputs, "cuda")
            call = lib.bind(ins, outs, scalars, torch.cuda.current_stream().cuda_stream,
                            workspace_for(lib, ins, outs, scalars, "cuda"))
            rc = call()
            torch.cuda.synchronize()
            bad = [str(mm) for k, (a, e) in enumerate(zip(outs, ref)) if (mm := compare(a, e, k)) is not None]
            if rc or bad:
                row["error"] = f"launch returned {rc}" if rc else f"wrong: {bad[0][:200]}"
                continue
            fns[label] = call
        if probe_build.ok:  # the card's own bytes moved and nothing else: its read/write mix
            outs = alloc_outputs(card.outputs, "cuda")
            fns["probe"] = Library(probe_build.library).bind(ins, outs, scalars, torch.cuda.current_stream().cuda_stream)
        n = max(16, card.bytes // 2 // 16 * 16)
        src = torch.empty(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        fns["copy"] = lambda dst=dst, src=src: dst.copy_(src)  # (timed in this iteration)
        stats, raw, _ = timer.time(fns)
        copy_us = stats["copy"].median
        probe_us = stats["probe"].median if "probe" in stats else None
        for row in rows:
            if row["config"] in stats:
                s = stats[row["config"]]
                sp = paired_ratio(raw["eager"], raw[row["config"]])
                row.update(us=s.median, q1=s.q1, q3=s.q3, vs_eager=sp.median, vs_eager_q1=sp.q1,
                           vs_eager_q3=sp.q3, pct_copy=100 * copy_us / s.median,
                           pct_probe=100 * probe_us / s.median if probe_us else None)
        case = {"card": card.id, "bytes": card.bytes, "floor_us": card.floor_us, "eager_us": stats["eager"].median,
                "copy_us": copy_us, "probe_us": probe_us, "rows": rows, "wall_s": time.time() - t0}
        report["cases"][name] = case
        (out / "config_sweep.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"\n{name}: eager {stats['eager'].median:.1f} µs, same-size copy {copy_us:.1f} µs, probe moving the "
              f"card's bytes {probe_us or float('nan'):.1f} µs, floor {card.floor_us:.1f} µs ({case['wall_s']:.0f} s)")
        print(f"  {'configuration':78s} {'µs':>8s} {'[q1, q3]':>16s} {'vs eager':>9s} {'%copy':>6s} {'%probe':>6s} "
              f"{'regs':>5s}")
        for row in rows:
            if "us" in row:
                print(f"  {row['config'][:78]:78s} {row['us']:8.1f} [{row['q1']:6.1f}, {row['q3']:6.1f}] "
                      f"{row['vs_eager']:8.2f}x {row['pct_copy']:5.0f}% {row['pct_probe'] or 0:5.0f}% "
                      f"{row.get('registers') or 0:5.0f}", flush=True)
            else:
                print(f"  {row['config'][:78]:78s} {row['error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
