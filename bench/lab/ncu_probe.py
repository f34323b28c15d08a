"""Answers: where does a template configuration's time go under Nsight Compute (duration, DRAM bytes
and throughput, occupancy, registers, shared memory, spills; --detail: warp stall reasons), against a
probe kernel that only moves the card's bytes (reads every byte of every input, writes every byte of
every output, 16 bytes a thread): what moving its bytes takes on this GPU with ncu's cold caches?
config_sweep.py times the same probe next to chosen configurations.

    python bench/lab/ncu_probe.py [--only NAME ...] [--configs 0,1] [--no-probe] [--detail]
    python bench/lab/ncu_probe.py --self-test

Prints a table and writes $OUT/ncu_probe.json. --self-test needs no GPU: the probe of cards shaped
like the families' reads every input and writes every output, 16 bytes a thread, and (with nvcc on
PATH) builds. What it found: docs/runs/issue-05-run-d.md to issue-05-run-g.md.
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

# case (templates_bench.CASES) -> parameter overrides on the family's first configuration
PROBES = {
    "group_norm_fp32_2x512x128x128": [{}, {"mode": "stash", "threads": 512}, {"mode": "cluster", "threads": 1024},
                                      {"mode": "split", "threads": 512},
                                      {"mode": "stream", "threads": 512, "ahead": 16},
                                      {"mode": "stream", "threads": 512, "ahead": 8},
                                      {"mode": "stream", "threads": 1024, "ahead": 8},
                                      {"mode": "stream", "threads": 256, "ahead": 8}],
    "group_norm_bf16_1x512x256x256": [{}, {"mode": "stash", "threads": 1024}, {"mode": "stream", "ahead": 8},
                                      {"mode": "stream", "ahead": 4}],
    "maxpool_module_fp16_32x64x112x112": [{}, {"mode": "thread", "owv": 2, "threads": 128}],
    "softmax_bf16in_fp32out_512x262144": [{}, {"mode": "stash", "tpr": 512, "vec": 8},
                                          {"mode": "stream", "tpr": 512, "ahead": 16, "segs": 16},
                                          {"mode": "stream", "tpr": 512, "ahead": 8, "segs": 4},
                                          {"mode": "stream", "tpr": 1024, "ahead": 16, "segs": 8}],
}

PROBE_SOURCE = r'''
#include <cuda_runtime.h>
#include <stdint.h>
#include "forge_kernel.h"
/* Moves the card's bytes and nothing else: thread i reads 16-byte word i of the input (if any)
   and writes word i of the output (if any). A read with no write to go to is kept alive by a
   store (to `keep`) under a condition random data never meets. */
__global__ void probe(const uint4* __restrict__ a, int64_t na, uint4* __restrict__ b, int64_t nb, uint4* keep) {
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (i < na) v = a[i];
    if (i < nb) b[i] = v;
    else if (v.x == 0x7f3a91c5u && v.y == 0x0badf00du) keep[0] = v;
}
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    /* input k is read with output k's writes (one launch each); an input or output without a
       partner is read or written alone */
    const int pairs = N_IN > N_OUT ? N_IN : N_OUT;
    for (int k = 0; k < pairs; ++k) {
        const int64_t na = k < N_IN ? NA[k] : 0, nb = k < N_OUT ? NB[k] : 0, n = na > nb ? na : nb;
        if (n > 0)
            probe<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
                k < N_IN ? (const uint4*)in[k].data : nullptr, na, k < N_OUT ? (uint4*)out[k].data : nullptr, nb,
                (uint4*)out[0].data);
    }
    return (int)cudaGetLastError();
}
'''


def probe_source(card) -> str:
    """The byte-moving probe for this card: every input read, every output written."""
    from forge_tui.kernel_abi import ITEMSIZE

    na = [s.numel * ITEMSIZE.get(s.dtype, 4) // 16 for s in card.inputs]
    nb = [o.numel * ITEMSIZE.get(o.dtype, 4) // 16 for o in card.outputs]

    def arr(v):
        return "{" + ", ".join(f"{x}LL" for x in v or [0]) + "}"

    head = (f"#define N_IN {len(na)}\n#define N_OUT {len(nb)}\n"
            f"static const int64_t NA[] = {arr(na)};\nstatic const int64_t NB[] = {arr(nb)};\n")
    return head + PROBE_SOURCE


DETAIL_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "WarpStateStats", "SchedulerStats", "Occupancy")


def detail(card_json: dict, library: str, store_root: str, timeout_s: float) -> str:
    """ncu's details page for the candidate's launch (the evaluator's ncu driver), the lines with
    numbers only: where its warps stall and how its memory traffic flows."""
    import shutil
    import subprocess

    from forge_tui.evaluator import ncu

    exe = shutil.which("ncu")
    if exe is None:
        return "ncu not on PATH"
    with tempfile.TemporaryDirectory(prefix="forge-ncu-detail-") as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"card": card_json, "library": library, "store": store_root}))
        cmd = [exe, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{ncu.NVTX_RANGE}/", "--page", "details",
               "--print-details", "all"]  # (all: the sections' tables too, the warp stall reasons among them)
        for sec in DETAIL_SECTIONS:
            cmd += ["--section", sec]
        cmd += [sys.executable, "-m", "forge_tui.evaluator.ncu", str(req)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"ncu did not finish within {timeout_s:.0f} s"
    keep = [ln.rstrip() for ln in proc.stdout.splitlines()
            if any(ch.isdigit() for ch in ln) and not ln.startswith("==") and "----" not in ln]
    return "\n".join(keep[:160])


def self_test() -> int:
    """Checks that need no GPU: the probe's word counts are each input's and output's bytes / 16 for
    cards shaped like the families' (one in, one out; group_norm's three and three; max_pool's int64
    indices; a two-input gate), and with nvcc on PATH every probe builds."""
    import re
    import shutil
    from types import SimpleNamespace

    from forge_tui.cards import TensorSpec
    from forge_tui.evaluator.build import Builder
    from forge_tui.kernel_abi import ITEMSIZE

    def spec(shape, dtype, role="input"):
        stride, acc = [], 1
        for d in reversed(shape):
            stride.insert(0, acc)
            acc *= d
        return TensorSpec(shape=list(shape), stride=stride, dtype=dtype, role=role)

    cards = {
        "softmax": ([((512, 4096), "bfloat16")], [((512, 4096), "float32")]),
        "group_norm": ([((2, 64, 32, 32), "float32"), ((64,), "float32"), ((64,), "float32")],
                       [((2, 64, 32, 32), "float32"), ((2, 32), "float32"), ((2, 32), "float32")]),
        "max_pool": ([((8, 64, 56, 56), "float16")], [((8, 64, 28, 28), "float16"), ((8, 64, 28, 28), "int64")]),
        "silu_mul": ([((64, 1024), "bfloat16"), ((64, 1024), "bfloat16")], [((64, 1024), "bfloat16")]),
    }
    sources = []
    for name, (ins, outs) in cards.items():
        card = SimpleNamespace(inputs=[spec(*t) for t in ins], outputs=[spec(*t, role="output") for t in outs])
        src = probe_source(card)
        na = [int(v) for v in re.findall(r"(\d+)LL", re.search(r"NA\[\] = \{(.*?)\}", src).group(1))]
        nb = [int(v) for v in re.findall(r"(\d+)LL", re.search(r"NB\[\] = \{(.*?)\}", src).group(1))]
        assert na == [s.numel * ITEMSIZE[s.dtype] // 16 for s in card.inputs], (name, na)
        assert nb == [o.numel * ITEMSIZE[o.dtype] // 16 for o in card.outputs], (name, nb)
        sources.append(src)
    if shutil.which("nvcc"):
        with tempfile.TemporaryDirectory(prefix="forge-ncu-probe-") as tmp:
            results = Builder("cuda", Path(tmp), arch="sm_90").build_many(sources)
        assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
        print("ncu_probe self-test: word counts and nvcc builds ok")
    else:
        print("ncu_probe self-test: word counts ok (nvcc not on PATH: builds skipped)")
    return 0


def main() -> int:
    import templates_bench as tb
    import torch

    from forge_tui.config import parse_config
    from forge_tui.evaluator.build import Builder
    from forge_tui.kernels.family import describe
    from forge_tui.templates.registry import match
    from forge_tui.workspace import profile_into_workspace

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--configs", help="comma-separated indices into each case's configurations (default: all)")
    ap.add_argument("--no-probe", action="store_true", help="skip the byte-moving probe kernel")
    ap.add_argument("--timeout", type=float, default=240.0, help="limit of one ncu run (s)")
    ap.add_argument("--detail", action="store_true",
                    help="also print ncu's details page (speed of light, memory, warp stall and scheduler sections)")
    ap.add_argument("--self-test", action="store_true", help="check the byte-moving probe (no GPU)")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    pick = [int(v) for v in args.configs.split(",")] if args.configs else None
    out = Path(os.environ.get("OUT") or ROOT / "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="forge-ncu-probe-"))
    (tmp / "forge.toml").write_text("[timing]\nwarmup = 1\nrepeats = 2\n[profile]\nsamples_per_card = 1\n"
                                    "max_sample_mib = 1200.0\n")
    parse_config({})
    builder = Builder("cuda", tmp / "build", arch="sm_90")
    report = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/lab/ncu_probe.py " + " ".join(sys.argv[1:]), "rows": []}
    names = [n for o in args.only for n in PROBES if o in n] if args.only else list(PROBES)
    for ci, name in enumerate(dict.fromkeys(names)):
        dtype, body, shapes, target = tb.CASES[name]
        wl = tmp / f"w_{ci}.py"
        wl.write_text(tb.workload_source(dtype, body, shapes))
        ws, _ = profile_into_workspace(wl, tmp / f"ws_{ci}", device="cuda", config_path=tmp / "forge.toml")
        card = max([c for c in ws.cards() if c.target.startswith(target)], key=lambda c: c.bytes)
        fam, m = match(card)
        p0 = fam.initial(m, "cuda")
        sources = [] if args.no_probe else [("probe: move the bytes", probe_source(card))]
        for k, over in enumerate(PROBES[name]):
            if pick is not None and k not in pick:
                continue
            p = {**p0, **over}
            if not fam.valid(m, p, "cuda"):
                print(f"{name}: skip invalid {p}", flush=True)
                continue
            sources.append((describe(m.family, getattr(fam, "relevant", lambda q: q)(p)), fam.render(m, p, "cuda")))
        for label, src in sources:
            row = profile_source(builder, card, ws, f"{name:36s} {label[:58]:58s}", src, args.timeout, args.detail)
            if row is not None:
                report["rows"].append({"case": name, "config": label, **row})
            (out / "ncu_probe.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


def profile_source(builder, card, ws, label: str, src: str, timeout_s: float, with_detail: bool) -> dict | None:
    """Build ``src`` and run it under ncu on the card's captured inputs; prints one line (and the
    details page with ``with_detail``); returns the row (None where the build failed)."""
    from forge_tui.evaluator import ncu

    b = builder.build(src)
    if not b.ok:
        print(f"{label}: build failed {b.reason[:400]}", flush=True)
        return None
    r = ncu.profile(card.model_dump(mode="json"), str(b.library), str(ws.store.root), timeout_s=timeout_s)
    r.pop("raw_csv", None)
    row = {"floor_us": card.floor_us, **r}
    if r.get("available"):
        print(f"{label} {r['duration_us']:8.1f} µs  DRAM {r['dram_bytes'] / 1e6:7.1f} MB "
              f"{r.get('achieved_bandwidth_Bps', 0) / 1e12:5.2f} TB/s ({r.get('dram_throughput_pct') or 0:4.0f}%)  "
              f"occ {r.get('achieved_occupancy_pct') or 0:4.0f}%  regs {r.get('registers_per_thread') or 0:4.0f}  "
              f"smem {r.get('shared_bytes_per_block') or 0:7.0f}  local {r.get('local_memory_bytes') or 0:.0f}  "
              f"kernels {len(r.get('kernels', []))}", flush=True)
    else:
        print(f"{label}: {r.get('reason')}", flush=True)
    if with_detail:
        row["detail"] = detail(card.model_dump(mode="json"), str(b.library), str(ws.store.root), timeout_s)
        print(row["detail"], flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
