"""What the served cards promise the whole forward: the bound from their isolated speedups and
shares, from their own times in the bench's process, and over torch.compile."""

from __future__ import annotations

import functools
import json
from typing import Any

from ..cards import CardKind
from ..promotion import kernels_dir
from ..rewrites import REWRITES
from ..runtime.fold import Pair
from ..runtime.manifest import Manifest
from ..timing import Stats


def shares_note(ws: Any) -> str | None:
    """What the bound's shares are, where the profile's op cards, each timed alone, sum past the
    forward (a host that holds the forward back: each op alone pays its launch and its wait, which
    the forward overlaps): the bound from them then promises more than the forward holds. None
    where they do not. They are not scaled down to the forward: shares so scaled set bounds that
    the bundled workloads pass, where unscaled ones err high, and a bound that errs high is the one
    a verdict can trust (docs/runtime.md)."""
    cov = (ws.profile_summary().get("coverage") or {}).get("op")
    if not isinstance(cov, (int, float)) or cov <= 1.0:
        return None
    return (f"the op cards, each timed alone, sum to {100 * cov:.0f}% of the forward: the shares, and the "
            "bound from isolation, count each op's launch and wait where the forward overlaps them")


def _saved_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served card with a speedup and a share, the share of eager's forward its isolated
    speedup promises to save: share x (1 - 1/speedup), fold, experts and merge cards included (the
    share of a fold: its pairs' ``fold_shares``; of the others, ``config_shares``)."""
    shares = {c.id: c.share for c in ws.cards()}
    folds = fold_shares(ws, man, served) | config_shares(ws, man, served)
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        sp, share = e.evidence.speedup_vs_eager, folds.get(card, shares.get(card))
        if served.get(card) and sp and share:
            out[card] = share * (1 - 1 / sp)
    return out


def isolation_bound(ws: Any, man: Manifest, served: dict[str, int]) -> float | None:
    """1 / (1 - sum of share x (1 - 1/speedup)) over the served cards (``_saved_shares``)."""
    saved = sum(_saved_shares(ws, man, served).values())
    return 1 / (1 - saved) if 0 < saved < 1 else None


def promised_us(ws: Any, man: Manifest, eager_us: float) -> dict[str, float]:
    """Per promoted card, what its isolated speedup promises to save of eager's forward
    (``eager_us``, µs): ``_saved_shares`` x eager_us."""
    return {c: v * eager_us for c, v in _saved_shares(ws, man, {c: 1 for c in man.entries}).items()}


def own_saved_us(ws: Any, man: Manifest, served: dict[str, int], eager_us: float,
                 own: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Per served card, what it saves of eager's forward (``eager_us``, µs) by its own times
    (``card_own_us``: eager's ops for the card and the served call, on cuda the device's time
    alone): its calls a forward times the difference. A card without them (a fold, merge or
    experts card; one its guard would not serve on its captured inputs) counts what its isolated
    speedup and share promise (``_saved_shares``)."""
    calls = {c.id: c.calls for c in ws.cards()}
    promised = _saved_shares(ws, man, served)
    out: dict[str, float] = {}
    for card in man.entries:
        if not served.get(card):
            continue
        if card in own and calls.get(card):
            out[card] = calls[card] * (own[card][0] - own[card][1])
        elif card in promised:
            out[card] = promised[card] * eager_us
    return out


def own_bound(ws: Any, man: Manifest, served: dict[str, int], eager_us: float,
              own: dict[str, tuple[float, float]]) -> float | None:
    """eager's forward over eager's forward less what the served cards save by their own times
    (``own_saved_us``); None without such times, or where they save nothing."""
    if not own or eager_us <= 0:
        return None
    saved = sum(own_saved_us(ws, man, served, eager_us, own).values())
    return eager_us / (eager_us - saved) if 0 < saved < eager_us else None


DEVICE_BOUND = 0.9
"""eager's forward captured in CUDA graphs taking at least this fraction of its op-by-op time:
the host hides behind the device, and op by op the forward waits on its device."""


def bound_basis(times: dict[str, Stats]) -> str:
    """"own times" where eager's forward is bound by its device: replayed from CUDA graphs (the
    host's launches out) it takes at least ``DEVICE_BOUND`` of its op-by-op time. There a card
    saves the forward its device time, and the isolated speedups, whose clock runs from the host's
    call to the device's idle, overstate what a card with many small eager ops saves (the decoder's
    RMSNorm: 8 launches whose host time exceeds their device time). "isolation" otherwise (no
    graphed times; a forward bound by its host saves what the calls cost the host too)."""
    eager, graphed = times.get("eager"), times.get("eager (graph)")
    if eager is None or graphed is None or eager.median <= 0:
        return "isolation"
    return "own times" if graphed.median >= DEVICE_BOUND * eager.median else "isolation"


def card_own_us(ws: Any, applied: Any, cards: list[str], dev: str, reps: int = 15) -> dict[str, tuple[float, float]]:
    """Per card of ``cards`` that a guard of ``applied`` serves (module, op and chain cards whose
    captured inputs pass the guard), eager's ops for the card and the served call, one call each
    on the card's captured inputs, interleaved ``reps`` times (the served call once before, to see
    that it serves): their medians, µs. On cuda the device's time alone (``Timer.device_us``: the L2 flushed, the device held busy
    while the host enqueues, CUDA events around the call), the evaluator's cold caches; on the cpu
    the call's. Fold, merge and experts cards have none: their own calls are not a card's."""
    from .. import timing
    from ..inputs import sample_inputs
    from ..program import run_program

    one = timing.Timer(dev, warmup=0, repeats=1, cold_l2=True).device_us if dev == "cuda" else timing.Timer._one_cpu
    out: dict[str, tuple[float, float]] = {}
    for cid in cards:
        guard = applied.guards.get(cid)
        card = ws.card(cid) if guard is not None else None
        if card is None or not card.samples:
            continue
        ins = sample_inputs(card, ws.store, 0, dev)
        if guard.mismatch(ins) or guard.serve(ins) is None:
            continue
        fns = {"eager": functools.partial(run_program, card.program, ins, dev),
               "served": functools.partial(guard.serve, ins)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                times[name].append(one(fn))
        if guard.status.active:  # a kernel that failed meanwhile fell back: its times are eager's
            out[cid] = (Stats.from_samples(times["eager"]).median, Stats.from_samples(times["served"]).median)
    return out


def compile_bound(ws: Any, man: Manifest, served: dict[str, int], compile_us: float) -> float | None:
    """What the cards served under torch.compile can give over its forward (``compile_us``, µs):
    each card's calls a forward times torch.compile's own time for the card in isolation (its
    kernels' device time where the evaluator had it), less the kernel's at its isolated speedup
    over torch.compile, summed over the cards, the forward's time over what is left. A card
    without torch.compile's time in its evidence (fold, merge, experts) counts nothing: an upper
    estimate, since torch.compile may fuse a card with its neighbours in the model, where the
    isolated card cannot. None where no served card has the numbers."""
    calls = {c.id: c.calls for c in ws.cards()}
    saved, counted = 0.0, False
    for card, e in man.entries.items():
        ev = e.evidence
        base = ev.compile_device_us if ev.compile_basis == "device" and ev.compile_device_us else ev.compile_us
        sp, n = ev.speedup_vs_compile, calls.get(card, 0)
        if served.get(card) and sp and base and n:
            saved += n * base * (1 - 1 / sp)
            counted = True
    if not counted or compile_us <= 0 or saved >= compile_us:
        return None
    return compile_us / (compile_us - saved)


def fold_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served fold card, the share of the forward its pairs took in eager: at each pair's two
    modules, their module cards' shares per site, or the op cards' profiled there where a module
    has none (a fold's evidence times the pair, convolution and batch norm, against the folded
    convolution)."""
    per_site: dict[str, float] = {}
    ops_at: dict[str, float] = {}
    """The op cards profiled in a module: its share where it has no module card of its own."""
    for c in ws.cards():
        if c.module_paths and c.share:
            into = per_site if c.kind == CardKind.MODULE else ops_at
            for p in c.module_paths:
                into[p] = into.get(p, 0.0) + c.share / len(c.module_paths)
    for p, share in ops_at.items():
        per_site.setdefault(p, share)
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        if e.signature.kind != CardKind.FOLD or not served.get(card):
            continue
        try:
            pairs = json.loads((kernels_dir(ws) / e.source).read_text())["pairs"]
        except (OSError, ValueError, KeyError):
            continue
        at = [Pair(p["parent"], p["conv"], p["bn"], "") for p in pairs]
        sites = [s for p in at for s in (p.conv_path, p.bn_path)]
        out[card] = sum(per_site.get(s, 0.0) for s in sites)
    return out


def config_shares(ws: Any, man: Manifest, served: dict[str, int]) -> dict[str, float]:
    """Per served card of a rewrite whose configuration records its share (``Rewrite.share_in_config``:
    experts, merge), its sites' share of the forward in eager, as ``forge experts`` and ``forge
    merge`` measured it (the sites' calls times their own time, over the forward's)."""
    kinds = {r.kind for r in REWRITES.values() if r.share_in_config}
    out: dict[str, float] = {}
    for card, e in man.entries.items():
        if e.signature.kind not in kinds or not served.get(card):
            continue
        try:
            share = json.loads((kernels_dir(ws) / e.source).read_text()).get("share")
        except (OSError, ValueError):
            continue
        if isinstance(share, (int, float)) and share > 0:
            out[card] = float(share)
    return out
