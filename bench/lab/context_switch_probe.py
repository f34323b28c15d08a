"""Answers: what does a round trip to the candidate's runner cost on the GPU right after the judge
used the device (a CUDA context switch between the two processes), against one after the judge sat
idle, and does a pause before the request remove it? Prints a table; JSON to $OUT if set."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from forge_tui.cards import TensorSpec  # noqa: E402
from forge_tui.evaluator.accused import Accused, runner_executable  # noqa: E402
from forge_tui.evaluator.build import Builder  # noqa: E402
from forge_tui.kernel_abi import Scalar  # noqa: E402


def med(xs):
    return statistics.median(xs) / 1000.0


def main() -> int:
    import torch

    cache = Path(tempfile.mkdtemp(prefix="forge-ctx-"))
    exe = runner_executable(cache)
    build = Builder("cuda", cache).build((ROOT / "tests/candidates/cuda/softmax_good.cu").read_text())
    rows, cols = 8192, 4096
    spec_in = [TensorSpec(shape=[rows, cols], stride=[cols, 1], dtype="float32")]
    spec_out = [TensorSpec(shape=[rows, cols], stride=[cols, 1], dtype="float32", role="output")]
    scalars = [Scalar("0.dim", -1), Scalar("0.half_to_float", False)]
    flush = torch.empty(64 << 20, device="cuda")
    x = torch.randn(rows, cols, device="cuda")
    out: dict = {}
    n = 25

    def judge_work():
        flush.zero_()
        torch.cuda.synchronize()

    with Accused(exe, build.library, spec_in, spec_out, scalars, "cuda", threads=1, call_limit_s=30,
                 confinement="off") as clean, \
            Accused(exe, build.library, spec_in, spec_out, scalars, "cuda", threads=1, call_limit_s=30,
                    confinement="required") as acc:
        clean.measure_overhead(5)
        acc.measure_overhead(5)
        acc.load()
        acc.inputs[0].copy_(x)
        torch.cuda.synchronize()
        for label, before, op in [
            ("empty, judge idle", None, "E"), ("empty, after judge work", judge_work, "E"),
            ("empty, after judge work + 2 ms", lambda: (judge_work(), time.sleep(0.002)), "E"),
            ("call, judge idle", None, "C"), ("call, after judge work", judge_work, "C"),
            ("call, after judge work + 2 ms", lambda: (judge_work(), time.sleep(0.002)), "C"),
            ("call, after judge work + 20 ms", lambda: (judge_work(), time.sleep(0.02)), "C"),
        ]:
            samples = []
            for _ in range(n):
                if before is not None:
                    before()
                else:
                    time.sleep(0.005)
                t0 = time.perf_counter_ns()
                if op == "E":
                    clean._request(b"E", b"", "setup")
                else:
                    acc.call()
                samples.append(time.perf_counter_ns() - t0)
            out[label] = med(samples)
        # the same kernel's device time, from the judge's own context (torch's softmax as a stand-in)
        ev = []
        for _ in range(n):
            judge_work()
            t0 = time.perf_counter_ns()
            torch.softmax(x, -1)
            torch.cuda.synchronize()
            ev.append(time.perf_counter_ns() - t0)
        out["judge's own softmax (host clock)"] = med(ev)
    for k, v in out.items():
        print(f"{k:40s} {v:10.1f} µs")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "context_switch_probe.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
