"""Answers: what does a compiled scope cost a decode step's call that no kernel serves? The
attention of the Llama workload's first layer, called with a one-token step's keyword arguments
(captured from a real ``generate``; no cache, so that every call does the same work), forge's
applied model against an untouched copy, in alternating blocks.

    python bench/lab/decode_call_probe.py [--blocks 9] [--calls 300]

CPU only, one thread; the workload's CPU-sized model (random weights), its chain and module cards
given the code generator's first kernel (as ``generate_shapes.py`` does), every card kept
(``only_faster=False``, no trial). Prints the median µs a call each way. JSON to $OUT if set.

Answer (2026-12-05, the development machine's CPU, torch 2.13.0, transformers 5.25; this probe at
`613e121` and at `d9f1c30`, alternating, two runs each): before `8ead9c2` the scope's call cost
+28.8 and +27.9 µs over eager's 191-194 µs; since (the call's lead looked at before the scope's
other checks, the forward's decorators and ``_run``'s frames) +22.5 and +23.0 µs over eager's
196-200. What is left is forge's own frames: the scope's gate, the lead's lookup (1.6 µs), the
two chain cards' fallback counts.

Since `a24ff60` (the lead looked up in the forward's parameter order, the fallbacks counted
under one lock, one frame fewer), alternating with `8315840`, two runs each: +22.0 and +24.0 µs
before, +16.4 and +18.0 after. Python run between two torch calls on this machine costs the
next call 2-4x its own time: ``lead_place`` alone took 2.1 µs, and 8 µs before an attention call.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "lab"))
CFG = "[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default=str(ROOT / "bench/workloads/hf_llama.py"))
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    import torch
    from generate_shapes import promote_generated

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload
    from forge_tui.workspace import profile_into_workspace

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "forge.toml"
        cfg.write_text(CFG)
        ws, _ = profile_into_workspace(Path(a.workload), Path(tmp) / "ws", device="cpu", config_path=cfg)
        promote_generated(ws, "cpu")
        model, inputs = load_workload(a.workload).build("cpu")
        model.eval()
        prompt = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        lm = getattr(model, "model", model)
        plain = copy.deepcopy(lm)
        captured: dict[str, tuple] = {}

        def grab(tag):
            def pre(_mod, args, kwargs):
                h = kwargs.get("hidden_states", args[0] if args else None)
                if h is not None and h.shape[1] == 1:  # a decode step's call
                    captured[tag] = (args, dict(kwargs))
            return pre

        def gen(m):
            m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)

        out: dict = {"workload": a.workload, "torch": torch.__version__}
        with torch.no_grad(), apply(model, ws, only_faster=False, trial_calls=0, device="cpu") as applied:
            for _ in range(3):  # the scope's variants compiled and found serving nothing at a step
                gen(lm)
            attn = {"eager": plain.model.layers[0].self_attn, "forge": lm.model.layers[0].self_attn}
            hooks = [m.register_forward_pre_hook(grab(k), with_kwargs=True) for k, m in attn.items()]
            gen(plain)
            gen(lm)
            for h in hooks:
                h.remove()
            for _args, kwargs in captured.values():
                for name in ("past_key_values", "cache"):
                    if name in kwargs:
                        kwargs[name] = None
            for _ in range(50):
                for k, m in attn.items():
                    m(*captured[k][0], **captured[k][1])
            us: dict[str, list[float]] = {k: [] for k in attn}
            for _ in range(a.blocks):
                for k, m in attn.items():
                    args, kwargs = captured[k]
                    t0 = time.perf_counter_ns()
                    for _ in range(a.calls):
                        m(*args, **kwargs)
                    us[k].append((time.perf_counter_ns() - t0) / a.calls / 1e3)
            scope = applied.scopes.get("model.model.layers.0.self_attn")
            out["uncovered"] = scope.uncovered if scope else None
        out["median_us"] = {k: statistics.median(v) for k, v in us.items()}
        out["blocks_us"] = us
    m = out["median_us"]
    print(f"attention call at a decode step: eager {m['eager']:.1f} µs, forge {m['forge']:.1f} µs "
          f"({m['forge'] - m['eager']:+.1f}); the scope ran {out['uncovered']} calls as written")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "decode_call_probe.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
