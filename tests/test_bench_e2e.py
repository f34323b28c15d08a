"""bench/e2e_bench.py --small on one tiny workload (the CPU): profile, search, approve, bench,
overheads and the per-call cost land in its JSON, and the outputs of eager + forge agree with eager."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_e2e_bench_small_on_one_workload(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "e2e_bench.py"), "--small", "tiny_decoder", "--no-compile",
           "--top", "1", "--evals", "1", "--budget-s", "50", "--grace-s", "5",
           # a CPU shared with other work: approve whatever passed faster than eager, however it spread
           "--min-speedup", "1.0", "--max-spread", "1000", "--keep-slower", "--all-kernels"]
    env = {**os.environ, "OUT": str(tmp_path), "FORGE_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "e2e.json").read_text())
    assert report["options"]["device"] == "cpu" and report["command"].startswith("python bench/e2e_bench.py")
    w = report["workloads"]["tiny_decoder"]
    assert w.get("done"), w.get("error") or w.get("notes")
    assert not w.get("errors"), w["errors"]
    assert {"profile", "search", "approve", "bench eager", "overhead", "per-call"} <= set(w["phases_s"]), \
        (w["search"], w["approve"], w["notes"])
    assert w["profile"]["forward_us"]["median"] > 0 and w["search"]["evaluations"] == 1
    # the RMSNorm template beats eager on any CPU: approved, served, outputs equal to eager's
    assert w["approve"]["approved"], w["approve"]
    b = w["bench"]
    assert set(b["times_us"]) == {"eager", "eager+forge"} and b["speedups"]["eager+forge"]["median"] > 0
    assert b["outputs_agree"] == {"eager+forge": None}
    assert any(w["bench_first"]["served"].values()) and 0 < w["bench_first"]["served_share"] <= 1
    assert w["bench_first"]["bound"] and w["bench_first"]["of_bound"] > 0
    o = w["overhead"]
    assert o["installed_nothing"] and "overhead" in o["nothing promoted"]
    pc = w["per_call"]
    assert pc["eager_op_launch_us"] > 0
    assert all(v["served_us"] > 0 and v["eager_card_us"] > 0 for v in pc["cards"].values()), pc
    t = w["targets"]
    assert t["outputs agree"] == "pass"
    assert {"eager+forge >= 1.0x", "eager+forge >= 1.25x", "compile+forge >= compile", ">= 90% of bound",
            "overhead nothing promoted <= 1%"} <= set(t)
    assert "targets" in r.stdout and "tiny_decoder" in r.stdout.splitlines()[-1] or "written:" in r.stdout
