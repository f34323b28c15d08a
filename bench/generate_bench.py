"""Greedy generation, tokens per second four ways (issue 58's targets): what ``forge bench WORKLOAD
--generate N`` prints, for several workloads in one run, each with the workspace flow built first.

    python bench/generate_bench.py [WORKLOAD ...] [--new-tokens 64] [--batch 1 8] [--budget-s 560]
    python bench/generate_bench.py hf_llama_gen --workspace WS        # a given workspace: no flow built
    python bench/generate_bench.py tiny_decoder --device cpu --no-search --no-compile   # the CPU check

WORKLOAD: a bundled example's name or a workload file (default: decoder, moe and
bench/workloads/hf_llama_gen.py, each with a ``generate`` entry). For each, in a process of its own
(one workload failing or running out of time leaves the others their rows): the flow of the README
into a temporary workspace, each step skippable: profile (a generation of --new-tokens tokens from
a bundled example's largest batch of ``PROMPT_LEN``-token prompts, not its 4 x 1024 forward: range
cards over the prefill and the decode steps; --profile-forward profiles the prefill alone),
``forge experts`` and ``forge merge`` (every card that matches, --min-rewrite-speedup to ask more),
an offline search with the template proposer under a small fixed budget (--evals, --search-wall),
``forge approve --auto``; then the four ways (``forge_tui.generation.bench``): prefill and decode
tokens/s with spread, first call, token agreement, batch-1 decode against the bandwidth limit.
Writes $OUT/generate.json (or ./bench-out) after every workload; prints the tables last.

On the device machine the project's pure-Python dependencies travel as wheels (see
bench/e2e_bench.py; transformers is on the device image). One call of at most 10 minutes
(timeout 600):

    PYTHONUNBUFFERED=1 python3 bench/generate_bench.py 2>&1 | tee $OUT/generate.log

Each workload gets an even share of the budget (a fast one leaves its rest to the next) and is
killed at its end; its results are written only once its bench is done. torch.compile's first
calls (a compile per batch size, each way) can take most of a share: ``--no-search`` and fewer
``--repeats`` leave more for them, and a workload named alone gets the whole budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_WORKLOADS = ["decoder", "moe", "bench/workloads/hf_llama_gen.py"]

PROFILE_CONFIG = """
[timing]
warmup = 1
repeats = {repeats}
{cpu_timing}
[profile]
samples_per_card = 1
max_sample_mib = 1024.0

[search]
min_gain = 0.0
"""
CPU_TIMING = "max_spread = 10.0\nmax_slowdown = 1000.0\n"

WRAPPER = '''"""{name} at its generation shapes: its largest batch of PROMPT_LEN-token prompts (the bench's prefill)."""
from forge_tui.examples.{name} import *  # noqa: F401,F403
from forge_tui.examples.{name} import BATCHES, CONFIG, PROMPT_LEN


def get_inputs(device="cpu"):
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CONFIG.vocab, (max(BATCHES), PROMPT_LEN), generator=g).to(device)]
'''


def out_dir() -> Path:
    d = Path(os.environ.get("OUT") or "bench-out")
    d.mkdir(parents=True, exist_ok=True)
    return d


def workload_file(name: str, tmp: Path) -> str:
    """The workload to run: a bundled example as a file at its generation shapes, a path as it is."""
    if name.endswith(".py"):
        path = Path(name)
        return str(path if path.is_absolute() else ROOT / path)
    from forge_tui.examples import EXAMPLES

    if name not in EXAMPLES:
        raise SystemExit(f"generate_bench: no bundled example named {name!r}")
    f = tmp / f"{name}.py"
    f.write_text(WRAPPER.format(name=name))
    return str(f)


# ---- one workload (in its own process) ------------------------------------------------------------
def run_child(name: str, opts: dict[str, Any], deadline: float, record: Path) -> int:
    from forge_tui.cli import main as forge

    data: dict[str, Any] = {"workload": name, "phases_s": {}, "log": []}

    def save() -> None:
        record.write_text(json.dumps(data, indent=1))

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)
        data["log"].append(msg)

    def phase(what: str, t0: float) -> None:
        data["phases_s"][what] = round(time.time() - t0, 1)
        save()

    dev = opts["device"]
    with tempfile.TemporaryDirectory(prefix="forge-gen-") as tmpd:
        tmp = Path(tmpd)
        spec = workload_file(name, tmp)
        ws = opts.get("workspace")
        try:
            if ws is None:
                ws = str(tmp / "ws")
                cfg = tmp / "forge.toml"
                cfg.write_text(PROFILE_CONFIG.format(repeats=5 if dev == "cuda" else 10,
                                                     cpu_timing=CPU_TIMING if dev == "cpu" else ""))
                t0 = time.time()
                log("profiling")
                profile = ["--config", str(cfg), "profile", spec, "-w", ws, "--device", dev, "-q", "--limit", "8"]
                if opts["profile_generate"]:  # the prefill and every decode step, in range cards
                    profile += ["--generate", str(opts["new_tokens"])]
                if forge(profile) != 0:
                    raise RuntimeError("forge profile failed")
                phase("profile", t0)
                for step in ("experts", "merge"):
                    if not opts[step]:
                        continue
                    t0 = time.time()
                    rc = forge([step, spec, "-w", ws, "--device", dev, "--repeats", "5",
                                "--min-speedup", str(opts["min_rewrite_speedup"])])
                    log(f"forge {step}: exit {rc}")
                    phase(step, t0)
                if opts["search"]:
                    t0 = time.time()
                    wall = max(5.0, min(opts["search_wall"], (deadline - time.time()) * 0.3))
                    rc = forge(["--config", str(cfg), "search", ws, "--proposer", "templates", "--max-evals",
                                str(opts["evals"]), "--evals-per-card", "2", "--max-wall-s", f"{wall:.0f}", "-q"])
                    log(f"forge search: exit {rc} ({wall:.0f} s at most)")
                    phase("search", t0)
                t0 = time.time()
                rc = forge(["approve", ws, "--auto", "--min-speedup", str(opts["min_speedup"]),
                            "--max-spread", str(opts["max_spread"])])
                log(f"forge approve --auto: exit {rc}")
                phase("approve", t0)
            from forge_tui.generation.bench import generate_bench

            t0 = time.time()
            log(f"generation bench ({deadline - time.time():.0f} s left)")
            r = generate_bench(spec, ws, opts["new_tokens"], batches=tuple(opts["batch"]) if opts["batch"] else None,
                               device=dev, repeats=opts["repeats"], with_compile=opts["compile"],
                               compile_mode=opts["compile_mode"], switch_off=True)
            phase("generate", t0)
            data["result"] = r.to_json()
            data["table"] = r.table()
            data["mismatches"] = r.mismatches()
            data["done"] = True
            print(data["table"], flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded; the parent reports it and goes on
            data["error"] = f"{type(exc).__name__}: {exc}"
            data["traceback"] = traceback.format_exc()[-4000:]
            log(data["error"])
        save()
    return 0 if data.get("done") else 1


# ---- the run ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", help="example names or workload .py files (default: decoder, moe, "
                    "bench/workloads/hf_llama_gen.py)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    ap.add_argument("--workspace", help="use this workspace as it is (one workload): no profile, rewrite, search")
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens a generation (default: the workload's "
                    "NEW_TOKENS, else 64)")
    ap.add_argument("--batch", type=int, nargs="+", help="batch sizes (default: the workload's BATCHES, else 1 8)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per batch (default 3)")
    ap.add_argument("--no-compile", action="store_true", help="skip the two torch.compile ways")
    ap.add_argument("--compile-mode", default="default", help="torch.compile's mode for the compile way")
    ap.add_argument("--no-experts", action="store_true", help="skip forge experts")
    ap.add_argument("--no-merge", action="store_true", help="skip forge merge")
    ap.add_argument("--no-search", action="store_true", help="skip the offline search")
    ap.add_argument("--profile-forward", action="store_true", help="profile the prefill's forward alone (exact "
                    "cards at its shapes), not a generation of --new-tokens (range cards over the decode steps)")
    ap.add_argument("--evals", type=int, default=4, help="the search's evaluations per workload (default 4)")
    ap.add_argument("--search-wall", type=float, default=60.0, help="the search's wall limit, s (default 60)")
    ap.add_argument("--min-rewrite-speedup", type=float, default=0.0, help="experts/merge --min-speedup (default 0: "
                    "every card that matches; the bench then says what each way gained)")
    ap.add_argument("--min-speedup", type=float, default=1.05, help="approve --auto's threshold")
    ap.add_argument("--max-spread", type=float, default=0.3, help="approve --auto's threshold")
    ap.add_argument("--budget-s", type=float, default=560.0, help="wall limit of the whole run, s (default 560)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return ap


def options(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {"device": dev, "workspace": args.workspace, "new_tokens": args.new_tokens, "batch": args.batch,
            "repeats": args.repeats, "compile": not args.no_compile, "compile_mode": args.compile_mode,
            "experts": not args.no_experts, "merge": not args.no_merge, "search": not args.no_search,
            "profile_generate": not args.profile_forward,
            "evals": args.evals, "search_wall": args.search_wall, "min_rewrite_speedup": args.min_rewrite_speedup,
            "min_speedup": args.min_speedup, "max_spread": args.max_spread}


def new_tokens_for(name: str, opts: dict[str, Any]) -> int:
    if opts["new_tokens"]:
        return int(opts["new_tokens"])
    if name.endswith(".py"):
        return 64
    import importlib

    return int(getattr(importlib.import_module(f"forge_tui.examples.{name}"), "NEW_TOKENS", 64))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = options(args)
    out = out_dir()
    if args.child:
        opts["new_tokens"] = new_tokens_for(args.child, opts)
        return run_child(args.child, opts, args.deadline or time.time() + args.budget_s, out / f"generate_{Path(args.child).stem}.json")
    names = args.workloads or DEFAULT_WORKLOADS
    if args.workspace and len(names) != 1:
        raise SystemExit("generate_bench: --workspace goes with one workload")
    t_start = time.time()
    end = t_start + args.budget_s
    report: dict[str, Any] = {"command": "python bench/generate_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                              "device": opts["device"], "options": opts, "workloads": {}}
    import torch

    report["torch"] = torch.__version__
    if opts["device"] == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        report["transformers"] = None
    for i, name in enumerate(names):
        share = (end - time.time()) / (len(names) - i)  # a fast workload leaves its rest to the next
        if share < 20:
            report["workloads"][name] = {"error": f"not run: {end - time.time():.0f} s left"}
            continue
        deadline = time.time() + share
        # the child is told its workload by --child alone: the other arguments as given, less the names
        given = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in names]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--deadline", str(deadline), *given]
        record = out / f"generate_{Path(name).stem}.json"
        try:
            subprocess.run(cmd, timeout=share + 10, cwd=os.getcwd())
        except subprocess.TimeoutExpired:
            pass
        data = json.loads(record.read_text()) if record.is_file() else {}
        if not data.get("done") and "error" not in data:
            data["error"] = f"not finished in its {share:.0f} s"
        report["workloads"][name] = data
        (out / "generate.json").write_text(json.dumps(report, indent=1))
    print("\n" + "=" * 100)
    for name, data in report["workloads"].items():
        print(data.get("table") or f"{name}: {data.get('error')}")
        for m in data.get("mismatches") or []:
            print(f"  TOKENS DISAGREE: {m}")
        print(f"  phases (s): {data.get('phases_s')}\n")
    print(f"written: {out / 'generate.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
