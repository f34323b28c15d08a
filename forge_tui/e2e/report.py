"""The e2e bench's report: each workload's bench result as JSON (``bench_json``), its verdict on
the issue's targets (``targets``) and the run's summary tables (``tables``). ``bench/e2e_bench.py``
writes and prints them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..promotion import manifest
from ..rewrites import REWRITES
from .bounds import config_shares, fold_shares
from .result import AFTER_SWITCH_OFF, FRESH_COMPILE

SPEEDUP_TARGET = {"diffusion": 1.25, "decoder": 1.25, "moe": 1.25, "resnet": 1.25, "resnet50": 1.25}
"""eager + forge over eager asked of these workloads (issue 15; ResNet-50's by issue 17); the
CPU-sized ones carry their big sibling's."""


def bench_json(r: Any, ws: Any) -> dict[str, Any]:
    """``r`` (a ``BenchResult`` of workspace ``ws``) as the report's JSON, with the shares of the
    forward the served cards, folds, experts and merges took, and how far the forward came
    towards its bounds."""
    out = r.to_json()
    shares = {c.id: c.share or 0.0 for c in ws.cards()}
    served = [c for c, n in r.served.items() if n]
    man = manifest(ws)
    folds = fold_shares(ws, man, r.served)
    out["fold_share"] = sum(folds.values())
    xs = config_shares(ws, man, r.served)
    for kind in (rw.kind for rw in REWRITES.values() if rw.share_in_config):
        out[f"{kind}_share"] = sum(v for c, v in xs.items() if man.entries[c].signature.kind == kind)
    folds |= xs
    # the cards' shares come from different measurements (the profile's, a rewrite card's own
    # timing against the forward's), so their sum can pass the whole forward: the sum is kept,
    # the share reported is at most 1
    out["served_share_sum"] = sum(folds.get(c, shares.get(c, 0.0)) for c in served)
    out["served_share"] = min(1.0, out["served_share_sum"])
    # cards the compiled forward served whose kernel beat torch.compile's own for the card in
    # isolation: where the 1.05x target applies (the kernels the op-by-op forward serves are not
    # these: ResNet-50's batch norms are folded there and custom ops under torch.compile)
    out["beats_compile_in_isolation"] = beats_compile(man, r.served_compiled)
    sp = r.speedups.get("eager+forge")
    if r.bound and sp:
        out["of_bound"] = sp.median / r.bound
        out["of_bound_way"] = (sp.median - 1) / (r.bound - 1) if r.bound > 1 else None
    if r.own_bound and sp:
        out["of_own_bound"] = sp.median / r.own_bound
    return out


def beats_compile(man: Any, served_compiled: dict[str, int]) -> list[str]:
    """The cards served in the torch.compile + forge forwards whose kernel measured faster than
    torch.compile's own code for the card in isolation."""
    out = []
    for c, n in served_compiled.items():
        e = man.entries.get(c)
        if n and e is not None and (e.evidence.speedup_vs_compile or 0) > 1.0:
            out.append(c)
    return out



def _at_least(st: dict | None, x: float, never_below: bool = False) -> str:
    """pass / FAIL on the paired ratio's median; a 'never below' target whose median misses x while
    its q3 reaches it is not resolved by the measurement (neither pass nor fail)."""
    if not st:
        return "n/a"
    if st["median"] >= x:
        return "pass"
    if never_below and st["q3"] >= x:
        return f"unresolved (median {st['median']:.3f}x, q3 {st['q3']:.3f}x)"
    return "FAIL"


def targets(w: dict[str, Any]) -> dict[str, str]:
    """One workload's record (``w``: its bench JSON, overheads, whether it finished) judged on the
    issue's targets: per target "pass", "FAIL", "unresolved" or "n/a", with why where it helps."""
    name = Path(w["workload"]).stem.removeprefix("tiny_")
    b = w.get("bench") or {}
    sp = (b.get("speedups") or {}).get("eager+forge")
    # torch.compile + forge against torch.compile: where the bench kept the kernels in compiled models,
    # as timed again in a process of their own (the bench's own process is no sound baseline for it)
    spc = (b.get("speedups") or {}).get(FRESH_COMPILE) or (b.get("speedups") or {}).get("compile+forge/compile")
    out: dict[str, str] = {}
    if not w.get("done"):
        out["finished"] = "FAIL"
    # what the model runs once the bench's switch-off is done: the kernels left, timed again, or,
    # with every kernel off, eager's own code (apply installs nothing)
    after = (b.get("speedups") or {}).get(AFTER_SWITCH_OFF)
    served = [c for c, n in (b.get("served") or {}).items() if n]
    all_off = bool(served) and all(c in (b.get("switched_off") or {}) for c in served)
    measured = f"; measured with them: {sp['median']:.3f}x" if sp else ""
    if sp is None and w.get("done") and "bench" not in w:
        out["eager+forge >= 1.0x"] = "pass (nothing promoted: eager)"
    elif all_off and _at_least(sp, 1.0) != "pass":
        out["eager+forge >= 1.0x"] = f"pass after the switch-off (all {len(served)} kernels off: eager's code{measured})"
    elif after:
        out["eager+forge >= 1.0x"] = _at_least(after, 1.0, never_below=True) + f" (after the switch-off{measured})"
    else:
        out["eager+forge >= 1.0x"] = _at_least(sp, 1.0, never_below=True)
    if name in SPEEDUP_TARGET:
        goal = SPEEDUP_TARGET[name]
        verdict = _at_least(after or ({"median": 1.0, "q1": 1.0, "q3": 1.0} if all_off else sp), goal)
        bound = b.get("bound")
        if verdict == "FAIL" and bound is not None and bound < goal:
            # no runtime can reach it with these cards: say what is missing, not only that it failed
            verdict += (f" (the served cards' bound is {bound:.3f}x: the rest of the forward needs kernels "
                        f"for {goal}x)")
        out[f"eager+forge >= {goal}x"] = verdict
        spg = (b.get("speedups") or {}).get("graphs: forge/eager")
        if spg is not None:  # with --graphs: the host's launch cost out of both
            out[f"in CUDA graphs, eager+forge >= {SPEEDUP_TARGET[name]}x eager"] = _at_least(spg, SPEEDUP_TARGET[name])
    out["compile+forge >= compile"] = _at_least(spc, 1.0, never_below=True)
    off = [k for k in (b.get("switched_off") or {}) if k.endswith("(under torch.compile)")]
    if off and out["compile+forge >= compile"] != "pass":
        # what a user gets: the bench switched the kernels off for compiled models
        out["compile+forge >= compile"] = (f"pass after the switch-off ({len(off)} kernels off under torch.compile; "
                                           f"measured with them: {spc['median']:.3f}x)" if spc else "pass after the switch-off")
    if b.get("beats_compile_in_isolation"):
        out["compile+forge >= 1.05x compile"] = _at_least(spc, 1.05)
        cb = b.get("compile_bound")
        if out["compile+forge >= 1.05x compile"] == "FAIL" and cb is not None and cb < 1.05:
            out["compile+forge >= 1.05x compile"] += (
                f" (the cards served under torch.compile bound it at {cb:.3f}x by their isolated speedups over "
                "torch.compile's kernels: 1.05x needs more of its forward beaten)")
    else:
        out["compile+forge >= 1.05x compile"] = "n/a (no served kernel beats torch.compile's in isolation)"
    out[">= 90% of bound"] = _of_bound(b)
    if any(v is not None for k, v in (b.get("outputs_agree") or {}).items() if "forge" in k):
        out["outputs agree"] = "FAIL"
    elif b:
        out["outputs agree"] = "pass"
    o = (w.get("overhead") or {}).get("nothing promoted")
    if o is None:
        out["overhead nothing promoted <= 1%"] = "n/a"
    elif o["overhead"] <= 0.01:
        out["overhead nothing promoted <= 1%"] = "pass"
    elif o["q1"] <= 0.01:
        out["overhead nothing promoted <= 1%"] = f"unresolved (median {100 * o['overhead']:+.2f}%, q1 {100 * o['q1']:+.2f}%)"
    else:
        out["overhead nothing promoted <= 1%"] = "FAIL"
    return out


def _of_bound(b: dict[str, Any]) -> str:
    """The 90% target against the bound the forward is held to (``e2e.bound_basis``): where it
    is bound by its device, the bound from the served cards' own times (their device time, the
    host out), else the one from their isolated speedups; the other stated beside it."""
    own = b.get("bound_basis") == "own times" and b.get("of_own_bound") is not None
    ob = b.get("of_own_bound") if own else b.get("of_bound")
    if ob is None:
        return "n/a"
    verdict = "pass" if ob >= 0.9 else "FAIL"
    if own:
        other = f"; {100 * b['of_bound']:.0f}% of isolation's {b['bound']:.3f}x" if b.get("of_bound") is not None else ""
        return (f"{verdict} ({100 * ob:.0f}% of {b['own_bound']:.3f}x, the bound from the cards' device time: the "
                f"forward is bound by its device{other})")
    if b.get("of_own_bound") is not None:
        return f"{verdict} ({100 * ob:.0f}%; {100 * b['of_own_bound']:.0f}% of the cards' own times' {b['own_bound']:.3f}x)"
    return verdict



def _fmt_ms(st: dict | None) -> str:
    return "-" if not st else f"{st['median'] / 1000:.2f}±{(st['q3'] - st['q1']) / 2000:.2f}"


def _fmt_x(st: dict | None) -> str:
    return "-" if not st else f"{st['median']:.3f}x"


def tables(report: dict[str, Any]) -> str:
    """The run's summary tables, as the bench prints them: the four ways per workload, the CUDA
    graphs, the per-call costs, the phases and the targets."""
    out: list[str] = []
    ws_ = report["workloads"]
    gpus = sorted({w["gpu"] for w in ws_.values() if w.get("gpu")})
    torches = sorted({w["torch"] for w in ws_.values() if w.get("torch")})
    out.append(f"\n{report['label']}{', ' + ', '.join(gpus) if gpus else ''}, torch {', '.join(torches) or '?'}, "
          f"{report['date']}: {report['command']}")
    out.append("times: median ± half the inter-quartile range; ratios: medians of paired runs; served: share of the "
          "forward of the cards served; %bound: eager+forge / bound; own bnd: the bound from the served cards' own "
          "times in this process (eager's ops against the served call; on cuda their device time), * where the "
          "forward is bound by its device and held to it; ovh: overhead of the runtime over eager, with "
          "nothing promoted and with every kernel installed but disabled (falling back); outputs: of the forge "
          "variants, against eager (torch.compile + forge against torch.compile), agree* where torch.compile's own "
          "differ from eager's; c+f/compile with + where the bench kept forge's kernels in compiled models: the "
          "ratio timed again in a process of their own, which decided")
    out.append(f"{'workload':15s} {'eager ms':>12s} {'+forge ms':>12s} {'compile ms':>12s} {'c+forge ms':>12s} "
          f"{'forge/eager':>11s} {'c+f/compile':>11s} {'outputs':>8s} {'served':>7s} {'bound':>7s} {'%bound':>7s} "
          f"{'own bnd':>8s} {'%own':>5s} {'ovh none':>9s} {'ovh fallbk':>10s}")
    for name, w in ws_.items():
        b = w.get("bench") or {}
        t = b.get("times_us") or {}
        sp = b.get("speedups") or {}
        agree = b.get("outputs_agree")
        agree_s = "-" if agree is None else ("agree" if all(v is None for k, v in agree.items() if "forge" in k)
                                             else "DIFFER")
        if agree and agree_s == "agree" and agree.get("compile"):
            agree_s = "agree*"  # torch.compile's own outputs differ from eager's (its row in the log says how)
        o = w.get("overhead") or {}
        on = o.get("nothing promoted")
        of = o.get("every kernel falling back")
        eager = t.get("eager") or (w.get("profile") or {}).get("forward_us")
        share = f"{100 * b['served_share']:.1f}%" if "served_share" in b else "-"
        bound = f"{b['bound']:.3f}x" if b.get("bound") else "-"
        of_bound = f"{100 * b['of_bound']:.0f}%" if b.get("of_bound") is not None else "-"
        own = f"{b['own_bound']:.3f}x" if b.get("own_bound") else "-"
        own += "*" if b.get("bound_basis") == "own times" else ""
        of_own = f"{100 * b['of_own_bound']:.0f}%" if b.get("of_own_bound") is not None else "-"
        ovh_none = f"{100 * on['overhead']:+.2f}%" if on else "-"
        ovh_fb = f"{100 * of['overhead']:+.2f}%" if of else "-"
        cfc = _fmt_x(sp.get("compile+forge/compile"))
        if sp.get(FRESH_COMPILE):
            cfc = f"{_fmt_x(sp[FRESH_COMPILE])}+"
        out.append(f"{name:15s} {_fmt_ms(eager):>12s} {_fmt_ms(t.get('eager+forge')):>12s} {_fmt_ms(t.get('compile')):>12s} "
              f"{_fmt_ms(t.get('compile+forge')):>12s} {_fmt_x(sp.get('eager+forge')):>11s} "
              f"{cfc:>11s} {agree_s:>8s} {share:>7s} {bound:>7s} {of_bound:>7s} "
              f"{own:>8s} {of_own:>5s} {ovh_none:>9s} {ovh_fb:>10s}")
    graphed = {n: w for n, w in ws_.items() if "graphs: forge/eager" in ((w.get("bench") or {}).get("speedups") or {})}
    if graphed:
        out.append("\nin CUDA graphs (each forward captured once and replayed: the host's launch cost out of both)")
        out.append(f"{'workload':15s} {'eager ms':>12s} {'+forge ms':>12s} {'forge/eager':>11s} {'q1 - q3':>15s}")
        for name, w in graphed.items():
            t, g = w["bench"]["times_us"], w["bench"]["speedups"]["graphs: forge/eager"]
            out.append(f"{name:15s} {_fmt_ms(t.get('eager (graph)')):>12s} {_fmt_ms(t.get('eager+forge (graph)')):>12s} "
                  f"{_fmt_x(g):>11s} {g['q1']:7.3f}-{g['q3']:.3f}")
    out.append("\nper served kernel: host µs a call (guard + launch) | the guard alone | eager's ops for the card | "
          "one eager op's launch")
    for name, w in ws_.items():
        pc = w.get("per_call") or {}
        for cid, v in (pc.get("cards") or {}).items():
            if "served_us" in v:
                out.append(f"  {name:15s} {cid:42s} {v['served_us']:8.1f} | {v['guard_us'] or 0:6.1f} | "
                      f"{v['eager_card_us']:8.1f} ({v['eager_ops']} ops) | {pc['eager_op_launch_us']:6.1f}"
                      + (f"   first output alone: {v['served_first_us']:.1f}" if "served_first_us" in v else "")
                      + (f"   leaf module call: {v['leaf_served_us']:.1f} served"
                         f"{'' if v['leaf_fast'] else ' (no fast path)'} | {v['leaf_eager_us']:.1f} eager"
                         if "leaf_served_us" in v else ""))
            else:
                out.append(f"  {name:15s} {cid:42s} {v.get('note')}")
        for cid, why in ((w.get("bench_first") or {}).get("switched_off") or {}).items():
            out.append(f"  {name:15s} switched off {cid}: {why}")
        for note in w.get("notes", []):
            out.append(f"  {name:15s} note: {note}")
    out.append(f"\n{'workload':15s} phases (s)")
    for name, w in ws_.items():
        ph = w.get("phases_s") or {}
        out.append(f"{name:15s} " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()) + f"; wall {w.get('wall_s', 0):.1f}"
              + ("" if w.get("done") else f"  UNFINISHED: {w.get('error', '?')}"))
    out.append(f"\n{'workload':15s} targets")
    for name, w in ws_.items():
        tg = w.get("targets") or {}
        out.append(f"{name:15s} " + "; ".join(f"{k}: {v}" for k, v in tg.items()))
    return "\n".join(out)
