"""Nsight Systems' timeline summary of a candidate's call (evaluator/nsys.py): the report parsed,
nsys driven as a program on PATH (a stand-in here: no machine of ours has nsys), its failures
and its absence reported as results, and what the agent's profile tool shows of it."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from agent_tools.evaluate import format_profile, format_timeline
from forge_tui.evaluator import nsys
from forge_tui.evaluator.result import EvalResult

KERN_SUM = Path(__file__).parent / "data" / "nsys_kern_sum.csv"


def test_parse_kern_sum_skips_the_notices_and_counts_launches_a_call():
    ks = nsys.parse_kern_sum(KERN_SUM.read_text())
    assert [k["kernel"].split("(")[0] for k in ks] == ["void softmax_rows<float, 256>", "row_max_pass"]
    assert ks[0]["launches_per_call"] == 1.0  # two instances: the warm-up call and the measured one
    assert ks[0]["avg_us"] == pytest.approx(130.752) and ks[1]["max_us"] == pytest.approx(12.672)
    assert nsys.parse_kern_sum("no csv here\n") == []


def fake_nsys(folder: Path, stats_out: str, fail: str = "") -> Path:
    """An ``nsys`` that records its arguments, writes the report file ``profile -o`` names and
    prints ``stats_out`` for ``stats``; exits 3 on the subcommand named by ``fail``."""
    exe = folder / "nsys"
    log = folder / "calls.jsonl"
    exe.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open({str(log)!r}, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if args[0] == {fail!r}:
    sys.stderr.write("nsys: something went wrong\\n"); sys.exit(3)
if args[0] == "profile":
    Path(args[args.index("-o") + 1] + ".nsys-rep").write_text("report")
else:
    assert Path(args[-1]).is_file(), args
    sys.stdout.write({stats_out!r})
""")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return log


def test_timeline_runs_the_driver_under_nsys_then_reads_the_kernel_summary(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = fake_nsys(bin_, KERN_SUM.read_text())
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    t = nsys.timeline({"id": "c"}, "/x/lib.so", "/x/store")
    assert t["available"] and t["launches_per_call"] == 2.0 and len(t["kernels"]) == 2
    profile, stats = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert profile[0] == "profile" and "--trace=cuda,nvtx" in profile
    assert profile[-3:-1] == ["-m", "forge_tui.evaluator.ncu"]  # the same driver as Nsight Compute
    assert stats[:3] == ["stats", "--report", "cuda_gpu_kern_sum"] and stats[-1].endswith(".nsys-rep")


@pytest.mark.parametrize("fail", ["profile", "stats"])
def test_a_failing_nsys_is_a_reason_not_an_error(tmp_path, monkeypatch, fail):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake_nsys(bin_, KERN_SUM.read_text(), fail=fail)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    t = nsys.timeline({}, "lib.so", "store")
    assert not t["available"] and t["reason"] == f"nsys {fail} exited with status 3: nsys: something went wrong"


def test_no_nsys_and_no_kernels_are_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nsys.timeline({}, "lib.so", "store") == {"available": False,
                                                     "reason": "nsys (Nsight Systems) is not on PATH"}
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake_nsys(bin_, "Processing...\n")
    monkeypatch.setenv("PATH", str(bin_))
    assert "no kernel launch" in nsys.timeline({}, "lib.so", "store")["reason"]


def test_the_profile_tool_shows_the_timeline_beside_the_ncu_report():
    t = {"available": True, "launches_per_call": 2.0, "kernels": nsys.parse_kern_sum(KERN_SUM.read_text())}
    r = EvalResult.model_validate({"status": "passed", "card": "c", "backend": "cuda",
                                   "profile": {"available": False, "reason": "profiler unavailable: ncu is not on PATH",
                                               "timeline": t}})
    text = format_profile(r)
    assert "Nsight Systems timeline: 2 kernel launches a call" in text
    assert "kernel row_max_pass(const float *, float *, long): total_us 25.216, launches_per_call 1," in text
    assert format_timeline({"available": False, "reason": "nsys (Nsight Systems) is not on PATH"}) == [
        "Nsight Systems timeline unavailable: nsys (Nsight Systems) is not on PATH"]
    assert format_timeline(None) == []


def test_the_app_ncu_pane_lists_the_timeline():
    from forge_tui.ui.backend import NodeDetail
    from forge_tui.ui.widgets.search.ncu import metrics

    t = {"available": True, "launches_per_call": 2.0, "kernels": nsys.parse_kern_sum(KERN_SUM.read_text())}
    r = EvalResult.model_validate({"status": "passed", "card": "c", "backend": "cuda",
                                   "profile": {"available": True, "duration_us": 143.1, "timeline": t}})
    lines, _ = metrics(NodeDetail(card="c", node="n0001", result=r))
    assert "nsys: 2 kernel launches a call" in lines
    assert any(ln.strip().startswith("row_max_pass") and "x1" in ln and "12.61 µs avg" in ln for ln in lines)
