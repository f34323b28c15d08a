"""The bench scripts the device runs, run on the CPU in their small modes: a script that breaks
here would cost a device call to find out."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(720)  # the script's budget is a hang guard here: a loaded machine takes longer, never less
def test_codegen_bench_small_gives_every_case_a_correct_kernel(tmp_path):
    cases = ["modules/HandGroupNorm/", "modules/Rotary/"]
    env = dict(os.environ, OUT=str(tmp_path), FORGE_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "codegen_bench.py"), "--device", "cpu", "--small",
                          "--sources", "modules", "--cases", *cases, "--evals", "2", "--budget-s", "600"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=700)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "codegen_cpu.json").read_text())
    assert {"date", "device", "device_name", "torch", "command", "settings", "sources", "cases", "skipped"} <= set(report)
    assert report["device"] == "cpu" and not report["skipped"]
    assert sorted(report["cases"]) == ["modules/HandGroupNorm/fp32/2x8x4x4", "modules/Rotary/fp32/2x4x8x16"]
    for name, case in report["cases"].items():
        assert "error" not in case, (name, case.get("traceback"))
        assert case["family"] == "generated" and case["card"].startswith("mod-")
        assert 1 <= case["evals"] <= 2 and case["first_correct"] == 1, (name, case["nodes"])
        assert case["copy_us"] > 0 and case["bytes"] > 0
        assert case["targets"]["correct"] is True
        best = case["best"]
        if best is None:
            # correct, but timed on a machine too busy to trust (CI runs two test workers on two
            # cores): the evaluator claims no speedup, and neither does the script
            assert {n["status"] for n in case["nodes"]} == {"noisy"}, (name, case["nodes"])
            continue
        assert best["status"] == "passed", (name, case["nodes"])
        for key in ("speedup_vs_eager", "sp_q1", "sp_q3", "eager_us", "time_us", "move"):
            assert best[key] is not None, (name, key)
        assert best["sp_q1"] <= best["speedup_vs_eager"] <= best["sp_q3"]
        assert case["reloaded_matches_eager"] is True  # the kernel reported, loaded again, is eager's
    # the per-evaluation lines and the table, its last lines
    assert "n0001: passed" in run.stdout or "n0001: noisy" in run.stdout
    table = run.stdout[run.stdout.index("code generator bench, cpu"):]
    assert all(name in table for name in report["cases"]) and "correct pass" in table


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_copy_timed_as_a_candidate_is_a_card_of_the_same_bytes_and_a_kernel_that_builds(tmp_path):
    """codegen_bench.py's reference for the 85% target on the GPU: a copy of the card's bytes, of
    its dtype, as a module card, evaluated as a candidate (here: the card and the build; the
    timing needs the GPU)."""
    from forge_tui.codegen_targets import COPY_KERNEL, COPY_WORKLOAD
    from forge_tui.evaluator.build import Builder
    from forge_tui.workspace import profile_into_workspace

    nbytes = 3 * 4096 * 2 * 2  # a 3-tensor bf16 card of 4096 elements each
    n = nbytes // 2 // 2 // 16 * 16
    spec = tmp_path / "copy.py"
    spec.write_text(COPY_WORKLOAD.format(n=n, dtype="bfloat16"))
    ws, _ = profile_into_workspace(spec, tmp_path / "ws", device="cpu")
    cards = [c for c in ws.cards() if c.kind == "module"]
    assert len(cards) == 1 and cards[0].bytes == 2 * n * 2 and cards[0].dtype == "bfloat16"
    res = Builder("cuda", tmp_path / "build", arch="sm_90").build(COPY_KERNEL.replace("{itemsize}", "2"))
    assert res.ok, res.log[:2000]


def test_the_torch_compile_target_reads_device_time_where_measured():
    """codegen_bench.py's torch.compile target: the evaluator's ratio is a call's latency, which
    charges torch.compile's call of the card alone its guards and wrappers (a compiled model pays
    them once a graph); where the device's times were measured, ours against torch.compile's code
    on the device decides, within 3% where torch.compile runs at 90% of a copy or more."""
    from forge_tui.codegen_targets import targets

    best = {"speedup_vs_eager": 8.0, "compile_us": 90.0, "speedup_vs_compile": 5.9, "time_us": 15.0}
    case = {"best": best, "first_correct": 1, "copy_us": 16.0, "bytes": 1 << 20}
    assert targets(case, "cuda", 20, 64 << 20)["vs_compile"] is True  # latency: 5.9x
    case["device_time"] = {"speedup_vs_compile_device": 0.92, "compile_pct_copy_device": 80.0}
    assert targets(case, "cuda", 20, 64 << 20)["vs_compile"] is False  # its kernel is faster
    case["device_time"] = {"speedup_vs_compile_device": 0.98, "compile_pct_copy_device": 93.0}
    t = targets(case, "cuda", 20, 64 << 20)
    assert t["vs_compile"] is True and t["compile_at_floor"] is True  # within 3% of a kernel at the floor
    case["device_time"]["compile_pct_copy_device"] = 85.0
    assert targets(case, "cuda", 20, 64 << 20)["vs_compile"] is False
