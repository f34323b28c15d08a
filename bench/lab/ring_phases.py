"""Answers: where do the template's ring kernels (softmax over long rows, group_norm) spend their
time on the GPU, phase by phase, block by block, and what does each part cost when taken out?

Each block's thread 0 stamps the clock at four points of every unit (row or group) it walks, in the
template's own rendered kernel (the stamps are spliced into the rendered source here, at anchors
this script checks; the product templates carry no instrumentation). Per case and configuration,
built with nvcc and run once after a 256 MB write that flushes L2:

  load+stats  unit start -> the block's own statistics done (its chunks landed and summed)
  merge       -> the cluster's statistics merged (cluster barrier and exchange)
  write       -> thread 0's stores of the unit issued (the next unit's loads requested after)
  gap         -> the next unit's start

how far apart the blocks sharing an SM run (do they compute their statistics at the same moments,
leaving DRAM idle together?), when the blocks finish (the last round's tail), and a timeline of the
share of blocks writing. --ablate runs the first choice again without one part (ABLATIONS; the
output is then wrong and not checked), for that part's time.

    python bench/lab/ring_phases.py [--only NAME ...] [--extra 'NAME={"cl": 16}' ...] [--ablate NAME ... | all]
    python bench/lab/ring_phases.py --self-test

Prints a table per case and writes $OUT/ring_phases.json. Needs nvcc and a GPU of compute
capability 9.0. --self-test needs neither: it checks that every anchor and ablation is found in each
case's rendered first choice (a template change breaks them), that the analysis reads a known
timeline, and, where nvcc is on PATH, that the softmax harness builds. What it found:
docs/runs/issue-05-run-g.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from forge_tui.kernels.family import Match, describe  # noqa: E402
from forge_tui.templates.families.group_norm import GroupNorm  # noqa: E402
from forge_tui.templates.families.softmax import Softmax  # noqa: E402

MAXR = 16  # units stamped per block
KERNELS = {"softmax": "softmax_ring", "group_norm": "gn_ring"}  # family -> its ring kernel


def _gn_info(n, c, h, w, g, dtype):
    return {"x": 0, "w": 1, "b": 2, "n": n, "c": c, "hw": h * w, "g": g, "eps": 1e-5, "tin": dtype, "tw": dtype,
            "tb": dtype, "tout": dtype, "tstat": dtype, "group_len": c // g * h * w}


# name -> (family, match info, tensors (shape, dtype) in, out, list of overrides on the first choice)
CASES = {
    "softmax_bf16in_fp32out_512x262144": (
        Softmax(), {"rows": 512, "cols": 262144, "tin": "bfloat16", "tout": "float32", "log": False},
        [((512, 262144), "bfloat16")], [((512, 262144), "float32")], [{}]),
    "group_norm_fp32_2x512x128x128": (
        GroupNorm(), _gn_info(2, 512, 128, 128, 32, "float32"),
        [((2, 512, 128, 128), "float32"), ((512,), "float32"), ((512,), "float32")],
        [((2, 512, 128, 128), "float32"), ((2, 32), "float32"), ((2, 32), "float32")], [{}]),
    "group_norm_bf16_1x512x256x256": (
        GroupNorm(), _gn_info(1, 512, 256, 256, 32, "bfloat16"),
        [((1, 512, 256, 256), "bfloat16"), ((512,), "bfloat16"), ((512,), "bfloat16")],
        [((1, 512, 256, 256), "bfloat16"), ((1, 32), "bfloat16"), ((1, 32), "bfloat16")], [{}]),
}

# anchor text in the rendered ring kernel -> the same text with a stamp before (or after) it
SPLICES = {
    "softmax_ring": [
        ("    for (int row = cid; row < rows; row += clusters, round ^= 1) {",
         "    int ph_i = -1;\n    for (int row = cid; row < rows; row += clusters, round ^= 1) {\n        ++ph_i;\n"
         "        STAMP(ph_i, 0);"),
        ("        block_ms<THREADS>(m, s);\n        if (t == 0) part[round]",
         "        STAMP(ph_i, 1);\n        block_ms<THREADS>(m, s);\n        if (t == 0) part[round]"),
        ("        m = merged.x;\n", "        m = merged.x;\n        STAMP(ph_i, 2);\n"),
        ("        ring_refill<TI, CE, BULK>(keep, bar, xn,",
         "        STAMP(ph_i, 3);\n        ring_refill<TI, CE, BULK>(keep, bar, xn,"),
    ],
    "gn_ring": [
        ("    for (int g = cid; g < ng; g += clusters, round ^= 1) {",
         "    int ph_i = -1;\n    for (int g = cid; g < ng; g += clusters, round ^= 1) {\n        ++ph_i;\n"
         "        STAMP(ph_i, 0);"),
        ("        block_welford<THREADS>(cnt, pivot, s1, s2, n, mean, m2);\n        if (t == 0) { part[round]",
         "        STAMP(ph_i, 1);\n        block_welford<THREADS>(cnt, pivot, s1, s2, n, mean, m2);\n"
         "        if (t == 0) { part[round]"),
        ("        mean = stat[0];\n", "        mean = stat[0];\n        STAMP(ph_i, 2);\n"),
        ("        ring_refill<TX, CE, BULK>(keep, bar, an,",
         "        STAMP(ph_i, 3);\n        ring_refill<TX, CE, BULK>(keep, bar, an,"),
    ],
}

# Ablations (--ablate NAME ...): the kernel with one part taken out, for its time alone (the output
# is wrong; nothing checks it). Each is a list of (text, replacement), every occurrence replaced.
ABLATIONS = {
    "softmax_ring": {
        # the cluster barrier and the exchange: each block normalises by its own partials
        "no-cluster-merge": [("        cluster.sync();\n        if (t < 32) {", "        __syncthreads();\n        if (t < 32) {"),
                             ("*cluster.map_shared_rank(&part[round], t)", "part[round]")],
        # the running max and sum: a max and a sum of the raw values instead (no exp)
        "no-stats-exp": [("ms_add<VEC>(m, s, v);", "for (int j_ = 0; j_ < VEC; ++j_) { m = fmaxf(m, v[j_]); s += v[j_]; }")],
        # the exp of the write
        "no-write-exp": [("__expf(v - m) * inv", "(v - m) * inv")],
    },
    "gn_ring": {
        "no-cluster-merge": [("        cluster.sync();\n        if (wid == 0) cluster_publish", "        __syncthreads();\n"
                              "        if (wid == 0) cluster_publish")],
    },
}

STAMP_HEAD = r"""
#include <stdint.h>
#define MAXR %d
__device__ uint64_t forge_phase_t[1024 * MAXR * 4];  /* globaltimer, ns */
__device__ long long forge_phase_c[1024 * MAXR * 4]; /* clock64 of the block's SM */
__device__ int forge_phase_sm[1024];
#define STAMP(r, k) do { if (threadIdx.x == 0 && (r) < MAXR) { \
    uint64_t t_; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t_)); \
    const int64_t i_ = ((int64_t)blockIdx.x * MAXR + (r)) * 4 + (k); \
    forge_phase_t[i_] = t_; forge_phase_c[i_] = clock64(); \
    if ((r) == 0 && (k) == 0) { unsigned s_; asm volatile("mov.u32 %%0, %%%%smid;" : "=r"(s_)); forge_phase_sm[blockIdx.x] = (int)s_; } \
} } while (0)
""" % MAXR

DTYPE = {"float32": ("FORGE_FLOAT32", 4), "bfloat16": ("FORGE_BFLOAT16", 2), "float16": ("FORGE_FLOAT16", 2)}

MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); \
    if (e_ != cudaSuccess) { printf("CUDA error %%s at %%d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
__global__ void fill_bytes(uint16_t* p, int64_t n, unsigned seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        /* a bf16/fp16 of moderate size in each 16-bit half-word (fp32: two halves make a normal float) */
        p[i] = (uint16_t)(0x3c00u | (h & 0x03ffu)) ^ (uint16_t)((h >> 16) & 0x8000u);
    }
}
static void desc(forge_tensor& d, void* p, int dt, std::vector<int64_t> shape) {
    d.data = p; d.dtype = dt; d.ndim = (int32_t)shape.size();
    int64_t st = 1;
    for (int k = d.ndim - 1; k >= 0; --k) { d.shape[k] = shape[k]; d.stride[k] = st; st *= shape[k]; }
}
int main() {
    forge_tensor in[%(n_in)d] = {}, out[%(n_out)d] = {};
%(alloc)s
    const int64_t fl = 256ll << 20;
    void* flush; CK(cudaMalloc(&flush, fl));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> us;
    void *pt, *pc;
    CK(cudaGetSymbolAddress(&pt, forge_phase_t)); CK(cudaGetSymbolAddress(&pc, forge_phase_c));
    for (int i = 0; i < 6; ++i) {
        /* the stamps of this launch only (a block's units can differ from one launch to the next) */
        CK(cudaMemsetAsync(pt, 0, sizeof(uint64_t) * 1024 * MAXR * 4));
        CK(cudaMemsetAsync(pc, 0, sizeof(long long) * 1024 * MAXR * 4));
        CK(cudaMemsetAsync(flush, i, fl));
        CK(cudaEventRecord(e0));
        const int rc = %(call)s;
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        if (rc) { printf("forge_launch returned %%d\n", rc); return 1; }
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); us.push_back(ms * 1000.f);
    }
    std::vector<uint64_t> t(1024 * MAXR * 4); std::vector<long long> c(1024 * MAXR * 4); std::vector<int> sm(1024);
    CK(cudaMemcpyFromSymbol(t.data(), forge_phase_t, t.size() * 8));
    CK(cudaMemcpyFromSymbol(c.data(), forge_phase_c, c.size() * 8));
    CK(cudaMemcpyFromSymbol(sm.data(), forge_phase_sm, sm.size() * 4));
    int clk = 0; CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
    printf("{\"event_us\": [");
    for (size_t i = 0; i < us.size(); ++i) printf("%%s%%.2f", i ? ", " : "", us[i]);
    printf("], \"clock_khz\": %%d, \"blocks\": [", clk);
    bool first = true;
    for (int b = 0; b < 1024; ++b) {
        if (t[(size_t)b * MAXR * 4] == 0) continue;
        printf("%%s{\"b\": %%d, \"sm\": %%d, \"t\": [", first ? "" : ", ", b, sm[b]);
        first = false;
        for (int k = 0; k < MAXR * 4; ++k) printf("%%s%%llu", k ? ", " : "", (unsigned long long)t[(size_t)b * MAXR * 4 + k]);
        printf("], \"c\": [");
        for (int k = 0; k < MAXR * 4; ++k) printf("%%s%%lld", k ? ", " : "", c[(size_t)b * MAXR * 4 + k]);
        printf("]}");
    }
    printf("]}\n");
    return 0;
}
"""


def splice(src: str, kernel: str) -> str:
    for old, new in SPLICES[kernel]:
        if src.count(old) != 1:
            raise SystemExit(f"ring_phases: anchor not found once in {kernel}: {old[:60]!r} (the template changed)")
        src = src.replace(old, new)
    return src


def build(src: str, exe: Path, nvcc: str = "nvcc") -> subprocess.CompletedProcess:
    """nvcc the harness source to an executable."""
    cu = exe.with_suffix(".cu")
    cu.write_text(src)
    return subprocess.run([nvcc, "-O3", "-arch=sm_90", "-std=c++17", "-I", str(ROOT / "forge_tui" / "abi"),
                           "-o", str(exe), str(cu)], capture_output=True, text=True, timeout=300)


def ablate(src: str, kernel: str, cut: str) -> str:
    """The spliced source without the part ``cut`` (ABLATIONS[kernel])."""
    for old, new in ABLATIONS[kernel][cut]:
        if old not in src:
            raise SystemExit(f"ring_phases: ablation {cut}: {old[:60]!r} not in {kernel} (the template changed)")
        src = src.replace(old, new)
    return src


def harness(src: str, ins, outs) -> str:
    alloc = []
    for side, tensors in (("in", ins), ("out", outs)):
        for k, (shape, dtype) in enumerate(tensors):
            code, size = DTYPE[dtype]
            n = 1
            for d in shape:
                n *= d
            v = f"{side}{k}"
            alloc.append(f"    void* {v}; CK(cudaMalloc(&{v}, {n * size}));")
            alloc.append(f"    fill_bytes<<<1024, 256>>>((uint16_t*){v}, {n * size // 2}, {k * 7919 + (side == 'out')}u);")
            alloc.append(f"    desc({side}[{k}], {v}, {code}, {{{', '.join(str(d) for d in shape)}}});")
    if "forge_launch_ws" in src:  # scratch memory: as much as the candidate asks for
        alloc.append(f"    const int64_t ws_bytes = forge_workspace_bytes(in, {len(ins)}, out, {len(outs)}, nullptr, 0);")
        alloc.append("    void* ws; CK(cudaMalloc(&ws, ws_bytes > 0 ? ws_bytes : 16));")
        call = f"forge_launch_ws(in, {len(ins)}, out, {len(outs)}, nullptr, 0, ws, ws_bytes, nullptr)"
    else:
        call = f"forge_launch(in, {len(ins)}, out, {len(outs)}, nullptr, 0, nullptr)"
    return STAMP_HEAD + src + MAIN % {"n_in": len(ins), "n_out": len(outs), "alloc": "\n".join(alloc), "call": call}


def analyse(data: dict) -> dict:
    khz = data["clock_khz"]
    blocks = data["blocks"]
    t0 = min(b["t"][0] for b in blocks)
    span = max(max(v for v in b["t"] if v) for b in blocks) - t0
    phases = {"load+stats": [], "merge": [], "write": [], "gap": []}
    for b in blocks:
        c = b["c"]
        for r in range(MAXR):
            s = c[r * 4:(r + 1) * 4]
            if not all(s):
                break
            phases["load+stats"].append((s[1] - s[0]) / khz * 1e3)
            phases["merge"].append((s[2] - s[1]) / khz * 1e3)
            phases["write"].append((s[3] - s[2]) / khz * 1e3)
            if r + 1 < MAXR and c[(r + 1) * 4]:
                phases["gap"].append((c[(r + 1) * 4] - s[3]) / khz * 1e3)
    units = sum(1 for b in blocks for r in range(MAXR) if b["t"][r * 4 + 3])
    # blocks sharing an SM: how far apart their second unit's statistics finish (ns -> µs)
    by_sm: dict[int, list[int]] = {}
    for b in blocks:
        if b["t"][4 + 1]:
            by_sm.setdefault(b["sm"], []).append(b["t"][4 + 1])
    apart = [(max(v) - min(v)) / 1e3 for v in by_sm.values() if len(v) > 1]
    per_sm = statistics.median([len(v) for v in by_sm.values()]) if by_sm else 0
    # the tail: when blocks finish their last unit (µs from the first block's start)
    ends = sorted((max(v for v in b["t"] if v) - t0) / 1e3 for b in blocks)
    # a timeline in 30 bins: the share of blocks writing (digit d: d/10 to (d+1)/10 of the blocks)
    bins = 30
    line = []
    for j in range(bins):
        at = t0 + span * (j + 0.5) / bins
        writing = 0
        for b in blocks:
            t = b["t"]
            writing += any(t[r * 4 + 2] and t[r * 4 + 3] and t[r * 4 + 2] <= at < t[r * 4 + 3] for r in range(MAXR))
        line.append(min(9, int(10 * writing / len(blocks))))
    med = {k: statistics.median(v) if v else 0.0 for k, v in phases.items()}
    tot = {k: sum(v) for k, v in phases.items()}
    share = {k: tot[k] / max(1e-9, sum(tot.values())) for k in tot}
    return {"event_us_median": statistics.median(data["event_us"]), "span_us": span / 1e3, "blocks": len(blocks),
            "units_per_block": units / max(1, len(blocks)), "blocks_per_sm": per_sm,
            "phase_median_us": med, "phase_share": share,
            "same_sm_stats_apart_us": statistics.median(apart) if apart else None,
            "block_end_us": {"first": ends[0], "median": ends[len(ends) // 2], "last": ends[-1]},
            "writing_timeline": "".join(str(d) for d in line)}


def self_test() -> int:
    """Checks that need no GPU: every anchor (SPLICES) and ablation is in each case's rendered first
    choice, analyse() reads a known timeline, and with nvcc on PATH the softmax harness builds."""
    import shutil

    built = None
    for name, (fam, info, ins, outs, _) in CASES.items():
        m = Match(fam.name, None, info)
        p = fam.initial(m, "cuda")
        assert p["mode"] == "ring", (name, p)
        kernel = KERNELS[fam.name]
        src = splice(fam.render(m, p, "cuda"), kernel)
        assert src.count("STAMP(ph_i, ") == 4, name
        for cut in ABLATIONS[kernel]:
            assert ablate(src, kernel, cut) != src, (name, cut)
        built = built or harness(src, ins, outs)
    # two blocks on one SM, three units each: 1 µs loading, 2 merging, 3 writing, 0.5 to the next
    khz, blocks = 1_000_000, []
    for b in range(2):
        t, c = [0] * (MAXR * 4), [0] * (MAXR * 4)
        for u in range(3):
            for k, at in enumerate((0.0, 1.0, 3.0, 6.0)):
                c[u * 4 + k] = 1 + int((u * 6.5 + at) * 1000)
                t[u * 4 + k] = 10_000 + int((u * 6.5 + at + b) * 1000)
        blocks.append({"b": b, "sm": 0, "t": t, "c": c})
    a = analyse({"event_us": [20.0, 21.0], "clock_khz": khz, "blocks": blocks})

    def near(x, y):
        return abs(x - y) <= 1e-6 * max(1.0, abs(y))

    want = {"load+stats": 1.0, "merge": 2.0, "write": 3.0, "gap": 0.5}
    assert all(near(a["phase_median_us"][k], v) for k, v in want.items()), a["phase_median_us"]
    assert a["units_per_block"] == 3 and a["blocks_per_sm"] == 2 and near(a["same_sm_stats_apart_us"], 1.0), a
    ends = a["block_end_us"]
    assert near(ends["first"], 19.0) and near(ends["median"], 20.0) and near(ends["last"], 20.0), ends
    if shutil.which("nvcc"):
        with tempfile.TemporaryDirectory(prefix="forge-phases-") as tmp:
            r = build(built, Path(tmp) / "h")
            assert r.returncode == 0, r.stderr[-2000:]
        print("ring_phases self-test: anchors, ablations, analysis and the nvcc build ok")
    else:
        print("ring_phases self-test: anchors, ablations and analysis ok (nvcc not on PATH: build skipped)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--extra", nargs="*", default=[], help='NAME_SUBSTRING=JSON overrides, one more configuration')
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--ablate", nargs="*", default=[], help="also run each first choice without these parts "
                    "(ABLATIONS; the output is then wrong): its time alone")
    ap.add_argument("--self-test", action="store_true", help="check the anchors, ablations and analysis (no GPU)")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    out_dir = Path(os.environ.get("OUT", "."))
    results = []
    for name, (fam, info, ins, outs, overs) in CASES.items():
        if args.only and not any(o in name for o in args.only):
            continue
        overs = list(overs) + [json.loads(t) for k, _, t in (e.partition("=") for e in args.extra) if k in name]
        m = Match(fam.name, None, info)
        p0 = fam.initial(m, "cuda")
        print(f"{name}:")
        print(f"  {'configuration':66s} {'event µs':>9s} {'span':>7s} {'blocks':>6s} {'/SM':>4s} {'units':>5s}"
              f" {'load+stats':>10s} {'merge':>6s} {'write':>6s} {'gap':>5s}  {'same-SM apart':>13s}")
        kernel = KERNELS[fam.name]
        runs = [(over, []) for over in overs] + [({}, [a]) for a in args.ablate if a in ABLATIONS[kernel]]
        if "all" in args.ablate:
            runs.append(({}, sorted(ABLATIONS[kernel])))
        for over, cut in runs:
            p = {**p0, **over}
            label = describe(fam.name, fam.relevant(p)) + "".join(f" WITHOUT {c}" for c in cut)
            if p.get("mode") != "ring" or not fam.valid(m, p, "cuda"):
                print(f"  {label}: not a valid ring configuration")
                continue
            src = splice(fam.render(m, p, "cuda"), kernel)
            for c in cut:
                src = ablate(src, kernel, c)
            src = harness(src, ins, outs)
            with tempfile.TemporaryDirectory(prefix="forge-phases-") as tmp:
                exe = Path(tmp) / "h"
                b = build(src, exe, args.nvcc)
                if b.returncode:
                    print(f"  {label}: build failed\n{b.stderr[-2000:]}")
                    continue
                r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
            if r.returncode:
                print(f"  {label}: run failed: {r.stdout[-500:]} {r.stderr[-500:]}")
                continue
            raw = json.loads(r.stdout)
            a = analyse(raw)
            ph = a["phase_median_us"]
            apart = a["same_sm_stats_apart_us"]
            print(f"  {label[:66]:66s} {a['event_us_median']:9.1f} {a['span_us']:7.1f} {a['blocks']:6d} "
                  f"{a['blocks_per_sm']:4.0f} {a['units_per_block']:5.1f} {ph['load+stats']:10.2f} {ph['merge']:6.2f} "
                  f"{ph['write']:6.2f} {ph['gap']:5.2f}  {apart if apart is not None else float('nan'):13.2f}", flush=True)
            print("  " + "  ".join(f"{k} {v:.0%}" for k, v in a["phase_share"].items()) + " of the blocks' time;"
                  f" blocks end at {a['block_end_us']['first']:.1f} / {a['block_end_us']['median']:.1f} /"
                  f" {a['block_end_us']['last']:.1f} µs (first / median / last)")
            print(f"  blocks writing over the span, tenths: {a['writing_timeline']}")
            results.append({"case": name, "config": label, **a, "raw": raw})
    (out_dir / "ring_phases.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
