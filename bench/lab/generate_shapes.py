"""Asks: what does a generation loop cost with forge's kernels applied? The cards are profiled at
one forward's shapes; ``generate`` meets new shapes at every step (one token at a time, a cache
that grows), and a compiled scope compiled a variant of its forward for each new shape, up to
Dynamo's limit of 8 a scope, none of which its cards serve.

    python bench/lab/generate_shapes.py [--workload bench/workloads/hf_llama.py] [--new-tokens 24]

The workload's model for the device (``--device``, default cpu: its CPU-sized model; random
weights), profiled; each chain and module card given the code generator's first kernel for the
device, evaluated and promoted when correct; then greedy
``generate`` from the profiled prompt, eager and with the kernels applied, in this process. Prints
the wall time of each generation, the tokens' agreement, the compiles of each scope and the
cards' served and fallback counts. JSON to $OUT if set.

Answer (2026-12-05, the development machine's CPU, torch 2.13.0, transformers 5.25, the tiny
Llama of 2 layers, 24 new tokens, one run before and two after): ``generate``'s prefill is not the
profiled forward (its position ids are per sequence: the rotary chains' cos and sin inputs are
(2, 1, 16, 16), the cards' (1, 1, 16, 16)), so nothing in the attention is served; the RMSNorm
module card serves the prefill alone. Before `GraphScope.MAX_VARIANTS` and ``VariantBook`` each
attention scope compiled 8 variants (Dynamo's limit, its warning printed) and the first forge
generation took 5.5 s against eager's 0.06; since, the first layer's scope compiles 2 (the prefill,
a decode step), the second none, and it took 2.4-2.5 s, the rest being the model-level scope's
compile (Dynamo skipped its frame, which calls the layers in a loop, and compiled the frames below
it; its mask chain was then switched off). Since `apply._loops` that scope is intercepted, not
compiled: 1.20-1.28 s (three runs), the attention's and the leaves' first compiles. Generating
again: 0.050-0.057 s with forge, 0.040-0.077 eager. Same tokens every way.

With ``--only-faster`` (apply's default: each kernel tried in place), 48 tokens: before `6c510a7`
the trials timed the decode steps too, where the kernels serve nothing, and switched the RMSNorm
card off (a refused call against the module's own: 65-78 µs against 48-52), generating again in
0.081-0.083 s (eager 0.078); since, the trials time only calls a kernel can serve, the cards stay
on for the prefill, and scopes whose compiles served nothing run their forward as written:
0.087-0.088 s (eager 0.076-0.079).

Generating again in interleaved pairs (third session, 48 tokens, 9-11 pairs): with
``--only-faster``, 1.152x and 1.177x eager at `f185799`, 1.141x and 1.167x after the refusals were
made cheaper (`222fe54`, `bb96ba6`), within the machine's noise. The same protocol with the
RMSNorm card alone applied (every call of a decode step refused; a script outside this probe):
1.059-1.072x before, 1.028x after. Since a scope runs a call like one that served nothing
without its key (`07944f7`): 1.099x and 1.097x, against 1.186x and 1.188x at `f185799` in the
same alternation (11 pairs each). ``--device cuda`` asks the same
of the H200, where a decode step's host decides its time.

Fourth session (2026-12-05, 11 pairs, ``--only-faster``, 48 tokens): a module whose cards are all
off for good gets its own forward back (`9b8e583`), and an intercepted scope runs a call like one
that served nothing as written (`49b8d9d`). Before/after, alternating, two runs each: 1.065x and
1.080x at `e97cf02`, 1.078x and 1.110x after; the same within this machine's noise. The mask
chain's scope (the model's own forward) had been switched off by its trial in each run, and the
RMSNorm card was on in some runs and off in others, so the changes had little to take out here.

Fifth session (2026-12-05, same command): with the compiled scope's cheaper call as written
(`a24ff60`), alternating with `8315840`, two runs each: 1.069x and 1.057x before, 1.046x and 1.054x
after. The model's final norm, a child of the model's intercepted scope, is not taken out when its
card goes off (its forward is the scope's wrapper over forge's, and take-out only puts back a
forward nothing was set above): its guard still counts a fallback a step. Since `efef2c3`
the wrapper calls the module's own forward once the card is off: the RMSNorm card's "disabled"
fallbacks went from 532 to 5 in a run, and the loop, alternating with the commit before, two runs
each: 1.047x and 1.050x before, 1.045x and 1.042x after (within this machine's noise).
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
TIMING = {"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}}


def promote_generated(ws, device: str = "cpu") -> list[str]:
    """Each chain and module card the generator expresses, given its first kernel for ``device``,
    evaluated and promoted when correct; the promoted cards' ids."""
    from forge_tui.codegen import Generated
    from forge_tui.config import parse_config
    from forge_tui.evaluator import Evaluator
    from forge_tui.promotion import promote_kernel

    gen = Generated()
    done = []
    with Evaluator(ws.store, ws.cache, parse_config(TIMING), backend=device) as ev:
        for card in ws.cards():
            if card.kind not in ("chain", "module"):
                continue
            m = gen.match(card)
            if m is None:
                continue
            src = gen.render(m, gen.initial(m, device), device)
            r = ev.evaluate(card, src)
            if r.correct:
                promote_kernel(ws, card.id, src, r, by="generate_shapes")
                done.append(card.id)
    return done


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=str(ROOT / "bench/workloads/hf_llama.py"))
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the workload's GPU-sized model, "
                   "the generator's first cuda kernels, each generation timed to the device's end")
    p.add_argument("--pairs", type=int, default=9, help="interleaved eager/forge generations timed after the "
                   "first (default 9)")
    p.add_argument("--only-faster", action="store_true", help="apply as a user does by default: kernels tried in "
                   "place and kept only where faster (the probe keeps every kernel on otherwise)")
    a = p.parse_args()
    import torch

    from forge_tui.runtime.apply import apply
    from forge_tui.workload import load_workload
    from forge_tui.workspace import profile_into_workspace

    if a.device == "cpu":
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    out: dict = {"workload": a.workload, "torch": torch.__version__, "device": a.device}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "forge.toml"
        cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
        ws, _ = profile_into_workspace(Path(a.workload), Path(tmp) / "ws", device=a.device, config_path=cfg)
        out["promoted"] = promote_generated(ws, a.device)
        wl = load_workload(a.workload)
        model, inputs = wl.build(a.device)
        model.eval()
        prompt = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        lm = getattr(model, "model", model)  # the bundled HF workloads wrap the causal LM (``Logits``)

        def generate():
            sync()
            t0 = time.perf_counter()
            tokens = lm.generate(prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                    do_sample=False)
            sync()
            return tokens, time.perf_counter() - t0

        plain = copy.deepcopy(model)  # eager's side of the interleaved pairs

        def ratios(n: int) -> list[float]:
            """forge's generate time over eager's, in ``n`` pairs, each pair back to back."""
            nonlocal lm
            got = []
            for _ in range(n):
                lm = getattr(plain, "model", plain)
                _, e = generate()
                lm = getattr(model, "model", model)
                _, f = generate()
                got.append(f / e)
            return got

        with torch.no_grad():
            eager, out["eager_s"] = generate()
            with apply(model, ws, only_faster=a.only_faster, device=a.device) as applied:
                forged, out["forge_s"] = generate()
                _, out["forge_again_s"] = generate()
                out["ratios"] = ratios(a.pairs)
                out["scopes"] = {path or "the model": {"variants": s.variants, "serving": s.serving,
                                                       "stopped": s.stopped, "uncovered": s.uncovered,
                                                       "direct_calls": s.direct.calls if s.direct else None,
                                                       "calls": s.calls}
                                 for path, s in applied.scopes.items()}
                out["cards"] = [{k: c[k] for k in ("card", "active", "served", "fallbacks", "disabled_reason")}
                                for c in applied.status()["cards"]]
            _, out["eager_again_s"] = generate()
        out["same_tokens"] = bool(torch.equal(eager, forged))
    print(f"generate {a.new_tokens} tokens: eager {out['eager_s']:.3f} s (again {out['eager_again_s']:.3f}), "
          f"forge {out['forge_s']:.3f} s (again {out['forge_again_s']:.3f}); same tokens: {out['same_tokens']}")
    if out["ratios"]:
        r = sorted(out["ratios"])
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        print(f"generating again, forge over eager in {len(r)} interleaved pairs: median {statistics.median(r):.3f} "
              f"[{q[0]:.3f}, {q[2]:.3f}]")
    print(f"promoted: {', '.join(out['promoted']) or 'none'}")
    for path, s in out["scopes"].items():
        print(f"  scope {path}: {s['variants']} variants compiled, serving {s['serving']}, direct "
              f"{s['direct_calls']} of {s['calls']} calls, as written {s['uncovered']}; stopped: {s['stopped']}")
    for c in out["cards"]:
        print(f"  {c['card']}: served {c['served']}, fell back {dict(c['fallbacks'])}"
              + ("" if c["active"] else f", off: {c['disabled_reason']}"))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "generate_shapes.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
