"""Asks: on the norms whose rows are short (Gemma-3's and Qwen-3's per-head q/k norms, 256 and 128
columns; T5's layer norm, 1024), where the H100 had the generator's or the rms_norm family's best
kernel at 0.87-0.95x torch.compile's by device time (2026-12-05, sixth session), which of the
generator's row configurations reach torch.compile's kernel, and do several rows a thread
(``rpt``) close the gap? Profiles the ``transformers`` leaf modules of ``codegen_bench.py`` on
cuda, renders the generator's kernel for each norm card at its first configuration and a sweep
around it (threads a row, rows a block, rows a thread), and times every one against eager,
torch.compile and a same-size copy by device time (CUDA events, L2 flushed, interleaved), each
kernel's outputs checked against eager's.

    python bench/lab/row_configs.py [--cases Qwen3RMSNorm Gemma3RMSNorm T5LayerNorm] [--reps 30]
    python bench/lab/row_configs.py --cases Qwen3RMSNorm --configs tpr=16,rpb=4,rpt=8 --sass --reps 3

Prints a table per card; writes $OUT/row_configs.json.

Answers (H200, 2026-12-05, seventh session, `221cce9`: the sweep then had no ``rpt``, and tried
each configuration with and without ``early``, the weight's loads issued before the reduction):
- ``early`` is no gain: better by 0.1-0.6 µs on some configurations, worse by up to 2 µs on others
  (more registers a thread, fewer blocks an SM). The setting was removed again.
- The generator's best row configurations, by device time against torch.compile's kernel: Qwen-3
  per head 12.77 µs against 12.22 (0.957x, ``tpr=16 rpb=16``); Gemma-3 per head 12.74 against 12.29
  (0.965x); T5 8.03 against 8.45 (1.052x, ``tpr=64 rpb=4 vec=4``); Gemma-3 at 1536 columns 9.60
  against 11.58 (1.207x). In that run's codegen bench the search had promoted kernels 1.12x (Qwen-3)
  and 1.18x (T5) slower than these, chosen by ratios against noisy samples of eager: the ranking is
  now by the kernels' own times (``search.tree.pooled_speedups``).
- Nsight Compute on the Qwen-3 card (`data/2026-12-05-s7/call4-ncu-qwen3-h200.txt`): torch.compile's
  kernel runs 2048 blocks of 64 threads, 64 registers, 32 rows a block (8 rows of 16 threads'
  vectors a thread), 9.8 µs, DRAM 37%, SM 25%; ours (``tpr=8 rpb=32``) 2048 blocks of 256
  threads, 16 elements a thread, 10.4-11.0 µs, DRAM 33-35%, SM 39-40%. This led to ``rpt`` (rows a
  thread), swept here since.
- ptxas on the development machine (nvcc 13.0, sm_90, 2026-12-05, eighth session; no GPU): the
  generator's kernel for the Qwen-3 card takes 38 registers at its first configuration (``tpr=8
  rpb=32``), 64 at ``tpr=16 rpb=4 rpt=4`` and 120 at ``rpt=8`` (torch.compile's: 64 at 8 rows a
  thread); held to 64 by launch bounds, ``rpt=8`` spills 344 bytes. 32-bit row offsets in place of
  64-bit ones take ``rpt=8`` to 96 and ``rpt=4`` to 56; keeping the rows' values as loaded (bf16)
  and widening them again where the output reads them, behind an empty asm that stops the compiler
  reusing the first widening, changes nothing (122 registers; held to 64, still 344 bytes
  spilled): the values are not what fills the registers. The table now has each configuration's
  registers and spill bytes beside its time.
- H100 (2026-12-05, eighth session, `0c8eed0`, data/2026-12-05-s8/call1): rows a thread do not close
  the gap. Qwen-3 per head: torch.compile 15.04 µs; the generator's 18 configurations 15.90-16.86,
  the best at one row a thread (``tpr=8 rpb=8``, 0.946x), ``tpr=16 rpb=4 rpt=4`` (torch.compile's
  layout at 4 rows, 64 registers) 16.03 (0.938x), ``rpt=8`` (120 registers) 16.54 (0.909x).
  Gemma-3 per head: torch.compile 15.74, the best 15.90 (``tpr=32 rpb=2 rpt=2``, 0.990x), one row
  a thread 16.03 (0.982x). T5: torch.compile 9.41, the best 9.47 at one row a thread (0.993x).
  Gemma-3 at 1536 columns: 10.69 against 13.79 (1.290x), rows a thread only slower. So a jump to
  torch.compile's layout from the first configuration (tried as `4ed2b8b`) was reverted.
- Since `6c0dd12` (no row's liveness or clamp where a thread's rows fill whole groups) ptxas gives
  the Qwen-3 card's kernel 48 registers at ``rpt=8`` and 40 at ``rpt=4`` (120 and 64 before): one
  wave of 64-thread blocks, as torch.compile's.
- H100 (2026-12-05, ninth session, `ad81753`, data/2026-12-05-s9/call1): the registers were not what
  held the rows-a-thread layouts back. Qwen-3 per head: torch.compile 15.14 µs; the 18
  configurations 15.94-18.05, the best again at one row a thread (``tpr=8 rpb=8``, 38 registers,
  0.950x); torch.compile's layout ``tpr=16 rpb=4 rpt=8`` at 48 registers 16.58 (0.913x), as slow as
  ``rpt=4`` at 40. Gemma-3 per head: ours 16.00 against torch.compile's 15.81 (0.988x, ``tpr=16
  rpb=16 rpt=2`` and ``rpt=4``). T5: 9.41 against 9.54 (1.014x, ``tpr=32 rpb=2``). Gemma-3 at 1536
  columns: 10.75 against 13.92 (1.295x). Every configuration of ours lands at 15.9-16.6 µs on both per-head
  cards (the same bytes) where torch.compile's kernel runs 15.1 on one and 15.8 on the other.
- Why (H100, ninth session, `--configs ... --sass`, then under Nsight Compute; data/2026-12-05-s9,
  call3-*): torch.compile's kernel for the Qwen-3 card keeps the model's ``.to(bf16)`` before the
  weight's product in fp32 (its source: ``tmp13 = tmp12.to(tl.float32)``, Inductor's
  ``emulate_precision_casts`` off) and executes 1.90M warp instructions; ours round it (eager's
  numerics, one F2F an element on the quarter-rate pipe: 16 of 208 SASS instructions a thread at
  one row a thread, 64 of 664 at 8 rows) and execute 2.66-3.21M. Under ncu (its clocks, cold
  caches) torch.compile's kernel 11.26-11.36 µs; ours 11.49 (``rpt=8``, 48 registers), 11.62-11.71
  (the first configuration), 11.87 (``rpt=4``), 12.13-12.16 (``tpr=8 rpb=8``), DRAM 46-48% against
  49%. This led to the ``nocast`` math mode (the model's fp32-to-half casts kept in fp32, the
  first move from the generator's start where a program has one), not yet timed on a GPU.
- H100 (2026-12-06, `6417ed3`, data/2026-12-06/row_configs.*): ``nocast`` is not it either. Qwen-3
  per head: torch.compile 15.14 µs; ``tpr=8 rpb=32`` 15.94 with ``nocast`` against 16.19 without,
  ``tpr=8 rpb=8`` 15.94 against 15.97 (0.950x and 0.948x), ``tpr=16 rpb=4 rpt=8 math=nocast``
  16.51. T5: 10.11 with against 10.21 without (torch.compile 9.34). Inside the spread: what keeps
  the per-head kernel 5% behind is neither its registers, its rows a thread nor its casts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def ptxas_usage(log: str, vec: int) -> tuple[int | None, int | None]:
    """(registers, spill-store bytes) ptxas reports for the kernel the launcher runs on aligned
    tensors (``fg_kernel<VEC, NV>``, VEC the configuration's vector width), from the build log."""
    import re

    for entry in re.split(r"Compiling entry function ", log)[1:]:
        name = entry.split("'", 2)[1] if entry.startswith("'") else ""
        if not re.search(rf"fg_kernelILi{vec}E", name):
            continue
        regs = re.search(r"Used (\d+) registers", entry)
        spill = re.search(r"(\d+) bytes spill stores", entry)
        return (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)
    return None, None


def sass_summary(library: str, vec: int) -> dict | None:
    """Opcode counts (global loads and stores, shuffles, all instructions) of the kernel the
    launcher runs on aligned tensors, from ``cuobjdump -sass`` of the built library (None where
    cuobjdump is missing): whether a layout issues its loads as the count of rows says."""
    import shutil
    import subprocess

    from math_mix import opcode_counts

    if shutil.which("cuobjdump") is None:
        return None
    ops = opcode_counts(subprocess.run(["cuobjdump", "-sass", library], capture_output=True, text=True).stdout, vec)
    if ops is None:
        return None
    return {"instructions": sum(ops.values()), "LDG": ops.get("LDG", 0), "STG": ops.get("STG", 0),
            "SHFL": ops.get("SHFL", 0), "top": dict(ops.most_common(12))}


def parse_config(text: str) -> dict:
    """``tpr=16,rpb=4,rpt=8`` -> {"tpr": 16, "rpb": 4, "rpt": 8} (integers where they parse)."""
    out: dict = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        out[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
    return out


def configs(gen, m, device) -> list[dict]:
    """The first configuration, then threads a row (half, as many and
    twice the first's) x blocks of 64 and 256 threads x rows a thread (1, 2, 4, 8): valid ones
    only, each once."""
    first = gen.initial(m, "cuda", device)
    out: list[dict] = []

    def add(p: dict) -> None:
        if gen.valid(m, p, "cuda", device) and p not in out:
            out.append(p)

    t0 = first["tpr"]
    for tpr, block, rpt in itertools.product((t0 // 2, t0, t0 * 2), (64, 256), (1, 2, 4, 8)):
        if tpr >= 4 and block % tpr == 0:
            add({**first, "tpr": tpr, "rpb": block // tpr, "rpt": rpt})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=["Qwen3RMSNorm", "Gemma3RMSNorm", "T5LayerNorm", "LlamaRMSNorm"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-configs", type=int, default=30, help="configurations a card at most")
    ap.add_argument("--configs", nargs="+", metavar="K=V,...", help="only these overrides of the first "
                    "configuration (e.g. tpr=16,rpb=4,rpt=8), the first itself included; for Nsight Compute")
    ap.add_argument("--sass", action="store_true", help="each kernel's opcode counts (cuobjdump) in the table's JSON")
    args = ap.parse_args(argv)

    import codegen_bench as cb
    import torch

    from forge_tui.codegen import Generated
    from forge_tui.evaluator.build import Builder
    from forge_tui.inputs import sample_inputs
    from forge_tui.kernel_abi import Library, alloc_outputs, card_scalars, workspace_for
    from forge_tui.kernels.device import detect_device
    from forge_tui.program import bind_program, compile_source, first_compiled_call
    from forge_tui.timing import Timer
    from forge_tui.workspace import profile_into_workspace

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-rowcfg-"))
    os.environ.setdefault("FORGE_CACHE_DIR", str(tmp / "cache"))
    cfg = tmp / "forge.toml"
    cfg.write_text(cb.CONFIG.format(ops="false", warmup=3, repeats=10, threads=0, max_sample_mib=1200.0))
    spec = tmp / "transformers_leaves.py"
    spec.write_text(cb.TRANSFORMERS_WORKLOAD.format(B=4, S=1024, small=False))
    t0 = time.time()
    ws, _ = profile_into_workspace(spec, tmp / "ws", device="cuda", config_path=cfg)
    print(f"profiled in {time.time() - t0:.1f}s", flush=True)
    gen = Generated()
    dev = detect_device()
    report: dict = {"date": time.strftime("%Y-%m-%d"), "device_name": torch.cuda.get_device_name(),
                    "torch": torch.__version__, "command": "python bench/lab/row_configs.py " + " ".join(sys.argv[1:]),
                    "cards": {}}
    builder = Builder("cuda", ws.cache)
    timer = Timer("cuda", cold_l2=True)
    seen: set[str] = set()
    for card in ws.cards():
        if card.kind != "module" or card.op_name not in args.cases or card.id in seen:
            continue
        seen.add(card.id)
        m = gen.match(card)
        if m is None:
            continue
        if args.configs:
            first = gen.initial(m, "cuda", dev)
            ps = [first] + [q for q in ({**first, **parse_config(c)} for c in args.configs)
                            if q != first and gen.valid(m, q, "cuda", dev)]
        else:
            ps = configs(gen, m, dev)[: args.max_configs]
        srcs = [gen.render(m, p, "cuda", dev) for p in ps]
        t0 = time.time()
        builds = builder.build_many(srcs)
        print(f"{card.op_name} {card.shapes()}: {len(ps)} configurations built in {time.time() - t0:.1f}s", flush=True)
        ins = sample_inputs(card, ws.store, 0, "cuda")
        stream = torch.cuda.current_stream().cuda_stream
        scalars = card_scalars(card.program)
        fns: dict[str, object] = {}
        loaded: dict[str, tuple] = {}
        rows: list[dict] = []
        for i, (p, b) in enumerate(zip(ps, builds)):
            name = f"k{i:02d}"
            row = {"name": name, "config": p, "built": b.ok}
            row["registers"], row["spill_bytes"] = ptxas_usage(b.log, p.get("vec", 1)) if b.ok else (None, None)
            if args.sass and b.ok:
                row["sass"] = sass_summary(str(b.library), p.get("vec", 1))
                print(f"  {name} {p}: {row['sass']}", flush=True)
            rows.append(row)
            if not b.ok:
                row["log"] = b.log[-600:]
                continue
            lib = Library(b.library)
            outs = alloc_outputs(card.outputs, "cuda")
            call = lib.bind(ins, outs, scalars, stream, workspace_for(lib, ins, outs, scalars, "cuda"))
            loaded[name] = (call, ins, outs)
            fns[name] = call
        n = max(16, card.bytes // 2 // 16 * 16)
        src_b = torch.empty(n, dtype=torch.uint8, device="cuda")
        dst_b = torch.empty_like(src_b)
        fns["copy"] = lambda dst_b=dst_b, src_b=src_b: dst_b.copy_(src_b)
        fns["eager"] = bind_program(card.program, ins, "cuda")
        compiled = torch.compile(compile_source(card.program, len(ins)), dynamic=False)
        err = first_compiled_call(compiled, *ins, device="cuda")
        if err is None:
            fns["compile"] = lambda compiled=compiled, ins=ins: compiled(*ins, device="cuda")
        med, iqr = cb.interleaved_device_us(fns, args.reps, lambda k: k.startswith("k"), timer)
        for row in rows:
            k = row["name"]
            if k in med:
                row["device_us"] = med[k]
                row["iqr_us"] = iqr[k]
                row["matches_eager"] = cb.outputs_match(card, ws, loaded[k])
                row["pct_copy"] = 100.0 * med["copy"] / med[k]
                if "compile" in med:
                    row["vs_compile"] = med["compile"] / med[k]
        entry = {"shapes": card.shapes(), "bytes": card.bytes, "copy_us": med["copy"], "eager_us": med["eager"],
                 "compile_us": med.get("compile"), "compile_error": err, "configs": rows,
                 "iqr_us": {k: iqr[k] for k in ("copy", "eager", "compile") if k in iqr}}
        report["cards"][f"{card.op_name} {card.shapes()}"] = entry
        print(f"\n{card.op_name} {card.shapes()}: copy {med['copy']:.2f} µs, eager {med['eager']:.2f}, "
              f"torch.compile {med.get('compile') or float('nan'):.2f}")
        print(f"  {'config':64s} {'µs':>7s} {'IQR':>13s} {'%copy':>6s} {'vs tc':>6s} {'regs':>4s} {'spill':>5s} ok")
        for row in sorted(rows, key=lambda r: r.get("device_us") or 1e9):
            p = row["config"]
            desc = " ".join(f"{a}={p[a]}" for a in ("tpr", "rpb", "rpt", "vec", "grid", "cache", "math") if a in p)
            if "device_us" not in row:
                print(f"  {desc:64s} {'build failed' if not row['built'] else '-'}")
                continue
            print(f"  {desc:64s} {row['device_us']:7.2f} [{row['iqr_us'][0]:5.2f},{row['iqr_us'][1]:5.2f}] "
                  f"{row['pct_copy']:6.1f} {row.get('vs_compile', float('nan')):6.3f} {row['registers'] or '-':>4} "
                  f"{row['spill_bytes'] if row['spill_bytes'] is not None else '-':>5} {row['matches_eager']}")
        (out_dir / "row_configs.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
