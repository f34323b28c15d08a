"""Answers: does the confined runner (seccomp + Landlock, runner.c) load and run a CUDA candidate on
this machine, what does each part of the cage cost, and what does the machine offer (libseccomp,
Landlock ABI)? Prints a table; writes JSON to $OUT/confine_probe.json when OUT is set."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from forge_tui.cards import TensorSpec  # noqa: E402
from forge_tui.evaluator.accused import Accused, CandidateProcessError, runner_executable  # noqa: E402
from forge_tui.evaluator.build import Builder  # noqa: E402
from forge_tui.kernel_abi import Scalar  # noqa: E402


def machine() -> dict:
    info = {"kernel": platform.release(), "python": sys.version.split()[0],
            "libseccomp": ctypes.util.find_library("seccomp")}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        v = libc.syscall(444, None, 0, 1)
        info["landlock_abi"] = v if v > 0 else f"unavailable (errno {ctypes.get_errno()})"
    except Exception as exc:  # noqa: BLE001
        info["landlock_abi"] = str(exc)
    try:
        info["seccomp_status"] = [ln for ln in open("/proc/self/status") if ln.startswith("Seccomp")]
    except OSError:
        pass
    return info


def main() -> int:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = Path(tempfile.mkdtemp(prefix="forge-probe-"))
    exe = runner_executable(cache)
    b = Builder(device, cache)
    folder = ROOT / "tests" / "candidates" / device
    name = "softmax_good.cu" if device == "cuda" else "softmax_good.cpp"
    build = b.build((folder / name).read_text())
    rows, cols = 4096, 4096
    spec_in = [TensorSpec(shape=[rows, cols], stride=[cols, 1], dtype="float32")]
    spec_out = [TensorSpec(shape=[rows, cols], stride=[cols, 1], dtype="float32", role="output")]
    scalars = [Scalar("0.dim", -1), Scalar("0.half_to_float", False)]
    out = {"machine": machine(), "device": device, "build_ok": build.ok, "variants": {}}
    x = torch.randn(rows, cols, device=device)
    if device == "cuda":
        shared = torch.empty(1024, device="cuda").untyped_storage()._share_cuda_()
        out["share_cuda"] = [type(v).__name__ + ":" + (str(len(v)) if isinstance(v, bytes) else repr(v)) for v in shared]
        print("share_cuda", out["share_cuda"])
    expected = torch.softmax(x, -1)
    for label, conf, ll in (("seccomp+landlock", "required", True), ("seccomp", "required", False),
                            ("off", "off", False)):
        row: dict = {}
        t0 = time.perf_counter()
        try:
            with Accused(exe, build.library, spec_in, spec_out, scalars, device, threads=os.cpu_count() or 1,
                         call_limit_s=30, confinement=conf, landlock=ll) as a:
                row["start_s"] = time.perf_counter() - t0
                ov = sorted(a.measure_overhead(21))
                row["overhead_us"] = ov[10] / 1000
                t1 = time.perf_counter()
                a.load()
                row["load_s"] = time.perf_counter() - t1
                row["confined"] = a.confined
                a.inputs[0].copy_(x)
                a.outputs[0].fill_(float("nan"))
                if device == "cuda":
                    torch.cuda.synchronize()
                times = []
                for _ in range(21):
                    rc, dt = a.call()
                    times.append(dt / 1000)
                row["rc"] = rc
                row["call_us_median"] = sorted(times)[10]
                row["max_err"] = float((a.outputs[0] - expected).abs().max())
        except CandidateProcessError as exc:
            row["error"] = f"{exc.kind}: {exc}"
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["total_s"] = time.perf_counter() - t0
        out["variants"][label] = row
    print(json.dumps(out["machine"], indent=1))
    print(f"{'variant':20s} {'start s':>8s} {'load s':>8s} {'overhead us':>12s} {'call us':>9s} {'max err':>9s}  note")
    for k, r in out["variants"].items():
        print(f"{k:20s} {r.get('start_s', 0):8.3f} {r.get('load_s', 0):8.3f} {r.get('overhead_us', 0):12.1f} "
              f"{r.get('call_us_median', 0):9.1f} {r.get('max_err', float('nan')):9.2e}  "
              f"{r.get('error') or r.get('confined', {}).get('landlock', '')}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "confine_probe.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
