"""Answers: does any way the kernels are launched make the host wait for the device? A served
call inside a forward cost the host far more than the same call timed alone with the device idle
(the diffusion's served group norms: 113-164 µs a call more than eager's inside the forward, 16-24
µs a call alone; docs/runs/issue-15-17-h200.md, ninth session). The launches that differ from a
plain <<<>>> are the cluster launch (cudaLaunchKernelEx with a cluster dimension), the attributes
set on every call (cudaFuncSetAttribute: dynamic shared memory past 48 KB, clusters past 8 blocks)
and the occupancy query of the ring mode (cudaOccupancyMaxActiveClusters).

Each way is timed on the host twice, with the device idle and behind 2 ms of queued work
(torch.cuda._sleep on the same stream): a way that waits for the device costs the host the queued
work's remaining time in the second case.

    python bench/lab/launch_block_probe.py        # on a machine with nvcc and a CUDA GPU

Prints a table; JSON to $OUT if set.

Answer on the H200 (2026-12-02, torch 2.11.0+cu130, docs/runs/data/2026-12-02-s9/call3-*): none
does. Behind 2 ms of queued work every way cost the host 1.9-7.8 µs, less than with the device
idle (5.0-16.5 µs): a plain launch 7.4, a cluster launch of 8 or 16 blocks 6.9-7.3, the occupancy
query and a launch 7.3, an attribute set on every call 1.9. What the forward's served calls cost
beyond their time alone comes from elsewhere. Inside the diffusion's forward, eager's own calls
also took far more than alone (`vae_norm_out`: 112 µs against 40): a launch queue kept full by a
forward bound by the device would explain both (not measured).

Second answer (2026-12-03 night, docs/runs/data/2026-12-03-e/call5-*): the cooperative launch of
the generated tiles grid (264 blocks of 1024 threads, cudaLaunchAttributeCooperative) does not
wait either: 9.7 µs behind 2 ms against 9.3 for a plain launch of the same grid. The stream's
queue holds about 1020 launches: behind 20 ms of work, the 1021st plain launch in a row waited
12.4 ms, every one before it 6.4 µs (median). A forward queues far fewer, so neither explains
the served `vae_norm_out` costing the host 211 µs inside the forward against eager's 77
(timeline of the same night, call 4).
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = r"""
#include <cuda_runtime.h>
__global__ void k_plain(float* p) { if (p && threadIdx.x == 1000) p[0] = 1.f; }
__global__ void k_smem(float* p) { extern __shared__ float s[]; s[threadIdx.x] = 1.f; if (p && threadIdx.x == 1000) p[0] = s[0]; }
__global__ void k_cluster(float* p) { if (p && threadIdx.x == 1000) p[0] = 1.f; }

static int ex(cudaStream_t s, int cl, int smem, void (*k)(float*)) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cl; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cl); cfg.blockDim = dim3(128); cfg.dynamicSmemBytes = smem; cfg.stream = s;
    cfg.attrs = attr; cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, k, (float*)nullptr);
}
extern "C" {
int plain(void* st) { k_plain<<<1, 128, 0, (cudaStream_t)st>>>(nullptr); return (int)cudaGetLastError(); }
int setattr_smem(void* st) {
    cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    k_smem<<<1, 128, 64 * 1024, (cudaStream_t)st>>>(nullptr); return (int)cudaGetLastError(); }
int smem_only(void* st) { k_smem<<<1, 128, 64 * 1024, (cudaStream_t)st>>>(nullptr); return (int)cudaGetLastError(); }
int cluster8(void* st) { return ex((cudaStream_t)st, 8, 0, k_cluster); }
int cluster16(void* st) {
    cudaFuncSetAttribute(k_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return ex((cudaStream_t)st, 16, 0, k_cluster); }
int occupancy8(void* st) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 8; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(8); cfg.blockDim = dim3(128); cfg.stream = (cudaStream_t)st; cfg.attrs = attr; cfg.numAttrs = 1;
    int fit = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, k_cluster, &cfg);
    if (e != cudaSuccess) return (int)e;
    return ex((cudaStream_t)st, 8, 0, k_cluster); }
int coop264(void* st) {  /* the tiles grid's launch: every SM twice, cooperative (emit_cuda._tiles) */
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(264); cfg.blockDim = dim3(1024); cfg.stream = (cudaStream_t)st; cfg.attrs = attr; cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, k_plain, (float*)nullptr); }
int plain264(void* st) { k_plain<<<264, 1024, 0, (cudaStream_t)st>>>(nullptr); return (int)cudaGetLastError(); }
int setattr_only(void* st) {
    (void)st; return (int)cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024); }
}
"""
WAYS = ["plain", "smem_only", "setattr_smem", "setattr_only", "cluster8", "cluster16", "occupancy8", "plain264",
        "coop264"]


def main() -> int:
    import torch

    tmp = Path(tempfile.mkdtemp())
    (tmp / "p.cu").write_text(SRC)
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", str(tmp / "p.so"),
                    str(tmp / "p.cu")], check=True)
    lib = ctypes.CDLL(str(tmp / "p.so"))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    fns = {w: getattr(lib, w) for w in WAYS}
    for f in fns.values():
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p]
    # cycles for about 2 ms of queued work
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize()
    cycles = int(10_000_000 * 2e-3 / (time.perf_counter() - t0))
    rows = []
    for w, f in fns.items():
        rc = f(stream)
        torch.cuda.synchronize()
        idle, busy = [], []
        for _ in range(30):
            torch.cuda.synchronize()
            a = time.perf_counter_ns()
            f(stream)
            idle.append((time.perf_counter_ns() - a) / 1000)
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            a = time.perf_counter_ns()
            f(stream)
            busy.append((time.perf_counter_ns() - a) / 1000)
            torch.cuda.synchronize()
        rows.append({"way": w, "rc": rc, "idle_us": statistics.median(idle), "behind_2ms_us": statistics.median(busy)})
    # how many launches the stream queues before a launch waits: behind 20 ms of work, the host
    # time of each of 4000 plain launches in a row (a forward bound by the device queues many)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles * 10)
    depth = []
    for _ in range(4000):
        a = time.perf_counter_ns()
        fns["plain"](stream)
        depth.append((time.perf_counter_ns() - a) / 1000)
    torch.cuda.synchronize()
    slow = [i for i, us in enumerate(depth) if us > 100]
    queue = {"first_launch_over_100us": slow[0] if slow else None, "launches_over_100us": len(slow),
             "median_us_first_500": statistics.median(depth[:500]), "max_us": max(depth)}
    print(f"behind 20 ms of work, 4000 plain launches in a row: {queue}")
    print(f"{'way':14s} {'rc':>3s} {'idle µs':>9s} {'behind 2 ms':>12s}")
    for r in rows:
        print(f"{r['way']:14s} {r['rc']:3d} {r['idle_us']:9.1f} {r['behind_2ms_us']:12.1f}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "launch_block_probe.json").write_text(json.dumps({"torch": torch.__version__,
                                                                    "gpu": torch.cuda.get_device_name(),
                                                                    "rows": rows, "queue": queue}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
