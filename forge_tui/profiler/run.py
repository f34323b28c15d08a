"""``forge profile``: run a workload under capture, time every card, and produce the op table."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Callable

from .. import roofline
from ..cards import Card, CardKind, Sample
from ..compare import compare
from ..config import ForgeConfig
from ..inputs import random_inputs
from ..program import bind_program, run_program
from ..quiet import Calibration, oversubscribed_reason, oversubscription, spread_reason
from ..tensorstore import TensorStore, unpack
from ..timing import Stats, Timer
from ..workload import Workload
from .capture import SCOPE_KEYS, Bucket, CaptureOptions, Recorder


@dataclass
class ProfileResult:
    cards: list[Card]
    forward: Stats
    device: str
    device_name: str
    dtype: str | None
    ceilings: dict
    skipped: dict[str, int]
    timing: dict
    calls_total: int
    warnings: list[str] = field(default_factory=list)
    forward_noisy: list[str] = field(default_factory=list)
    """Why the forward's time is not trustworthy (the machine was busy); empty when it is."""
    generate: int | None = None
    """New tokens of the profiled generation (``forward`` is then the generation's time), None
    for a forward's profile."""

    @property
    def coverage(self) -> dict[str, float]:
        """Sum of card times over the forward time, per granularity."""
        f = self.forward.median or 1.0
        return {kind.value: sum(c.total_us for c in self.cards if c.kind == kind) / f for kind in (CardKind.OP, CardKind.MODULE)}

    def summary(self) -> dict:
        return {
            "device": self.device, "device_name": self.device_name, "dtype": self.dtype,
            "forward_us": self.forward.to_json(), "ceilings": self.ceilings, "skipped": self.skipped,
            "timing": self.timing, "cards": len(self.cards), "calls_captured": self.calls_total,
            "coverage": self.coverage, "warnings": self.warnings, "forward_noisy": self.forward_noisy,
            **({"generate": self.generate} if self.generate is not None else {}),
        }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text)


def card_id(bucket: Bucket) -> str:
    if bucket.kind == CardKind.MODULE:
        name = "mod-" + _slug(bucket.target.split(":", 1)[1])
    elif bucket.kind == CardKind.CHAIN:
        ops = bucket.target.split(":", 1)[1].split("+")
        name = "chain-" + _slug("+".join(ops[:3]) + ("+" if len(ops) > 3 else ""))
    else:
        parts = bucket.target.split(".")
        name = _slug(parts[1] if len(parts) > 1 else bucket.target)
        if len(parts) > 2 and parts[2] != "default":
            name += "." + _slug(parts[2])
    return f"{name}-{bucket.key[:10]}"


def _main_dtype(bucket: Bucket) -> str:
    for s in bucket.inputs:
        if s.dtype.startswith(("float", "bfloat")) and s.role == "input":
            return s.dtype
    for s in bucket.inputs + bucket.outputs:
        if s.dtype.startswith(("float", "bfloat")):
            return s.dtype
    return (bucket.inputs or bucket.outputs)[0].dtype


def profile_workload(workload: Workload, device: str, dtype, cfg: ForgeConfig, store: TensorStore,
                     progress: Callable[[str], None] = lambda msg: None, coverage: bool = True,
                     generate: int | None = None) -> ProfileResult:
    """Profile the workload into cards. ``coverage``: store on each card which proposer covers it
    (``templates.coverage``); off where the caller works it out itself (a confined child's cards
    get it from the parent, ``describe.profile_confined``). ``generate``: profile a generation of
    that many new tokens instead of one forward (``profiler.generation``): its calls grouped into
    range cards, each card's calls and share split by phase, shares taken of the whole
    generation's time."""
    import torch

    threads = cfg.timing.threads or len(os.sched_getaffinity(0))
    if device == "cpu":
        torch.set_num_threads(threads)
    progress(f"building {workload.name} on {device}")
    model, inputs = workload.build(device, dtype)
    model.train(cfg.profile.train_mode)
    ceil = roofline.ceilings(device)
    timer = Timer.from_config(device, cfg.timing)
    warnings: list[str] = []
    quiet = QuietTimer(timer, Calibration(device, timer), cfg.timing)
    run: Callable[[], object] = functools.partial(workload.run, model, inputs)
    if generate is not None:
        from .generation import generation_runner

        run = generation_runner(workload, model, inputs, generate)
    with torch.no_grad():
        run()  # warm-up, and the model's own errors surface here
        progress("capturing operator calls")
        rec = Recorder(model, CaptureOptions(cfg.profile))
        marker = None
        if generate is not None:
            from .generation import PhaseMarker, generating_module_of

            marker = PhaseMarker(generating_module_of(model), rec)
        try:
            for _ in range(cfg.profile.forwards):
                if marker is not None:
                    marker.start()
                rec.run(run)
        finally:
            if marker is not None:
                marker.remove()
        what = "generation" if generate is not None else "forward"
        progress(f"timing the {what}")
        whole = run if generate is not None else functools.partial(model, *inputs)
        fwd_stats, noisy = quiet.time(what, whole, host_load=True)
        if noisy:
            warnings.append(f"the {what}'s time is not trustworthy, the machine was busy: " + "; ".join(noisy)
                            + " (shares and times below are suspect; profile again on a quiet machine)")
        del model, inputs, run, whole  # free the activations before the cards are replayed
        buckets = sorted(rec.buckets.values(), key=lambda b: b.first_seen)
        cards: list[Card] = []
        if generate is None:
            for i, b in enumerate(buckets, 1):
                progress(f"timing card {i}/{len(buckets)}: {b.target}")
                cards.append(_make_card(b, device, quiet, store, ceil, cfg.profile.forwards, fwd_stats.median, warnings,
                                        within=_within(b, rec.buckets)))
        else:
            from .generation import group_buckets

            groups = group_buckets(buckets)
            ids = {b.key: card_id(g.rep) for g in groups for b in g.buckets}
            for i, g in enumerate(groups, 1):
                progress(f"timing card {i}/{len(groups)}: {g.rep.target}")
                card = _make_card(g.rep, device, quiet, store, ceil, cfg.profile.forwards, fwd_stats.median, warnings,
                                  within=_group_within(g.buckets, ids))
                _widen(card, g, device, quiet, store, cfg.profile.forwards, fwd_stats.median, warnings)
                cards.append(card)
    for card in cards:
        if card.share is not None and card.share > 1.0:
            # a card cannot take longer than the whole forward: its time or the forward's is wrong
            card.flags = sorted({*card.flags, "share_over_forward"})
            warnings.append(f"{card.id}: timed at {100 * card.share:.0f}% of the forward, more than all of it: its "
                            f"time ({card.time_us:.1f} µs x {card.calls} calls) or the forward's "
                            f"({fwd_stats.median:.1f} µs) was disturbed; profile again on a quiet machine")
    cards.sort(key=lambda c: (-(c.share or 0.0), c.id))
    if coverage:
        from ..templates.coverage import cover

        cover(cards)  # which proposer covers each card, stored on it: what the op table shows
    return ProfileResult(
        cards=cards, forward=fwd_stats, device=device, device_name=ceil["device_name"],
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else (
            str(workload.default_dtype).removeprefix("torch.") if workload.default_dtype is not None else None),
        ceilings=ceil, skipped=dict(rec.skipped), timing={**timer.describe(), "threads": threads},
        calls_total=rec.seq,
        warnings=warnings, forward_noisy=noisy, generate=generate,
    )


class QuietTimer:
    """The timer, with the evaluator's quietness checks (``quiet.py``): a measurement taken while
    the calibration workload ran slow, while more threads were ready to run than there are CPUs
    (``host_load``), or whose samples spread too far is retried, and reported with its reasons if
    it stays loud.

    Once ``BUSY_AFTER`` measurements in a row stayed loud after their retries, the machine is busy
    for a while: later measurements get one attempt each until one comes out quiet, so that a
    profile on a busy machine takes no longer than on a quiet one (its loud cards are flagged and
    timed again once the machine is quiet, ``profiler.retime``)."""

    BUSY_AFTER = 2

    def __init__(self, timer: Timer, calibration: Calibration, cfg) -> None:
        self.timer = timer
        self.cal = calibration
        self.cfg = cfg
        self.loud_in_row = 0
        self.cal.measure()

    def busy(self) -> str | None:
        """Why the machine is too busy to time anything now (the calibration workload slower than
        its best, or, on the CPU, more threads ready to run than CPUs), or None."""
        reasons = [self.cal.loaded(self.cal.measure(), self.cfg.max_slowdown)]
        if self.cal.device == "cpu":
            reasons.append(oversubscribed_reason(oversubscription(), self.cfg.max_slowdown))
        return next((r for r in reasons if r), None)

    def time(self, name: str, fn: Callable[[], object], host_load: bool = False) -> tuple[Stats, list[str]]:
        """``host_load`` (the CPU): also count the threads ready to run before and after
        (``quiet.oversubscription``), a load the calibration workload can miss."""
        reasons: list[str] = []
        check_host = host_load and self.cal.device == "cpu"
        attempts = 1 + (self.cfg.noisy_retries if self.loud_in_row < self.BUSY_AFTER else 0)
        for _ in range(attempts):
            load = [oversubscription()] if check_host else []
            before = self.cal.measure()
            stats, _, _ = self.timer.time({name: fn})
            after = self.cal.measure()
            load += [oversubscription()] if check_host else []
            st = stats[name]
            host = [oversubscribed_reason(max((x for x in load if x is not None), default=None), self.cfg.max_slowdown)]
            reasons = [r for r in (self.cal.loaded(before, self.cfg.max_slowdown),
                                   self.cal.loaded(after, self.cfg.max_slowdown),
                                   spread_reason(name, st, self.cfg.max_spread, self.timer.overhead_iqr_us), *host) if r]
            if not reasons:
                break
        self.loud_in_row = self.loud_in_row + 1 if reasons else 0
        return st, reasons


def _within(b: Bucket, buckets: dict[str, Bucket]) -> list[str]:
    """The ids of the module cards an op card is nested in: every one of its calls was made inside
    their forwards (none outside a module card)."""
    if b.kind != CardKind.OP or b.outside or not b.parents or sum(b.parents.values()) != b.calls:
        return []
    return [card_id(buckets[k]) for k in sorted(b.parents, key=lambda k: -b.parents[k]) if k in buckets]


def _group_within(members: list[Bucket], ids: dict[str, str]) -> list[str]:
    """``_within`` of a card made of several buckets: the cards (by ``ids``, bucket key to card id)
    whose forwards made every call of every one of them."""
    if any(b.kind != "op" or b.outside or not b.parents or sum(b.parents.values()) != b.calls for b in members):
        return []
    calls: dict[str, int] = {}
    for b in members:
        for k, n in b.parents.items():
            if k in ids:
                calls[ids[k]] = calls.get(ids[k], 0) + n
    return sorted(calls, key=lambda c: (-calls[c], c))


def _widen(card: Card, g, device: str, quiet: "QuietTimer", store: TensorStore, forwards: int, total_us: float,
           warnings: list[str]) -> None:
    """``card`` (made from the group's most weighted bucket) as the group's card: its ranges, the
    samples of the range's ends beside its own, its calls and time over every size (each size's
    time that of the timed size nearest in elements: the most weighted and the ends), its calls
    and share per phase."""
    from ..ranges import heaviest_point, parse_key

    card.ranges = g.ranges
    for b in g.buckets[1:]:  # the calls of every size, so that a compiled scope compiles for them
        for key in b.scope_keys:
            if key not in card.scope_keys and len(card.scope_keys) < SCOPE_KEYS:
                card.scope_keys.append(key)
    timed: list[tuple[int, float]] = []
    if card.time_us is not None:
        timed.append((_elements(g.rep), card.time_us))
    if g.ranges:
        # the card's own samples are of its own inputs' sizes: the most weighted size of each
        # ranged dimension where one size is ranged, but where several are (a decode step's rows
        # and its KV length) the sizes of the most called shape, which ``heaviest_point``'s
        # dimension-by-dimension choice need not be
        point = {key: card.inputs[k].shape[d] for key in heaviest_point(card) for _, k, d in [parse_key(key)]}
        for s in card.samples:
            s.point = point
    for b in g.ends():
        if b.samples:
            ins, outs = b.samples[0]
            card.samples.append(Sample(inputs=[store.put_packed(p) for p in ins],
                                       outputs=[store.put_packed(p) for p in outs], point=g.point(b)))
            try:
                tensors = [unpack(p[0], p[1], p[2], p[3], device=device) for p in ins]
                stats, noisy = quiet.time(card.op_name, bind_program(b.program, tensors, device), host_load=True)
            except Exception as exc:  # noqa: BLE001 - a size whose replay fails is reported, not fatal
                warnings.append(f"{card.id}: replaying the reference at {g.point(b)} failed: {type(exc).__name__}: {exc}")
                continue
            if noisy:
                card.flags = sorted({*card.flags, "noisy_timing"})
            timed.append((_elements(b), stats.median))
    if not timed:
        card.calls = max(1, round(g.calls / forwards))
        return

    def time_of(b: Bucket) -> float:
        n = _elements(b)
        return min(timed, key=lambda e: abs(e[0] - n))[1]

    total = sum(time_of(b) * b.calls for b in g.buckets)
    card.calls = max(1, round(g.calls / forwards))
    card.time_us = total / g.calls
    phases: dict[str, int] = {}
    phase_us: dict[str, float] = {}
    for b in g.buckets:
        for ph, n in b.phases.items():
            phases[ph] = phases.get(ph, 0) + n
            phase_us[ph] = phase_us.get(ph, 0.0) + time_of(b) * n
    card.phases = {ph: max(1, round(n / forwards)) for ph, n in phases.items()}
    if total_us > 0:
        card.share = total / forwards / total_us
        card.phase_share = {ph: us / forwards / total_us for ph, us in phase_us.items()}
    if card.floor_us:
        card.headroom = card.time_us / card.floor_us


def _elements(b: Bucket) -> int:
    return sum(s.numel for s in b.inputs)


def _make_card(b: Bucket, device: str, quiet: QuietTimer, store: TensorStore, ceil: dict, forwards: int,
               forward_us: float, warnings: list[str], within: list[str] | None = None) -> Card:
    flags = set(b.flags)
    samples: list[Sample] = []
    for ins, outs in b.samples:
        samples.append(Sample(inputs=[store.put_packed(p) for p in ins], outputs=[store.put_packed(p) for p in outs]))
    if not samples:
        flags.add("no_sample")
    card = Card(
        id=card_id(b), kind=b.kind, target=b.target, label="", inputs=b.inputs, outputs=b.outputs,
        program=b.program, module_paths=b.module_paths, within=within or [], call_args=b.call_args, returns=b.returns,
        module_attrs=b.module_attrs, scope_keys=b.scope_keys, flags=[], calls=max(1, round(b.calls / forwards)),
        bytes=b.bytes, flops=b.flops, samples=samples, device=device, dtype=_main_dtype(b),
    )
    card.label = f"{card.op_name}({card.shapes()})"
    if b.samples:
        ins = [unpack(p[0], p[1], p[2], p[3], device=device) for p in b.samples[0][0]]
        expected = [unpack(p[0], p[1], p[2], p[3], device=device) for p in b.samples[0][1]]
    else:
        ins, expected = random_inputs(card, device, seed=0), None
    try:
        got = run_program(card.program, [t.clone() if "mutates" in flags else t for t in ins], device)
        if expected is not None:
            bad = next((m for m in (compare(g, e, k) for k, (g, e) in enumerate(zip(got, expected))) if m), None)
            if bad is not None:
                flags.add("reference_mismatch")
                warnings.append(f"{card.id}: the reference does not reproduce the captured output ({bad})")
        stats, noisy = quiet.time(card.op_name, bind_program(card.program, ins, device), host_load=True)
        card.time_us = stats.median
        card.time_spread = stats.spread
        if noisy:
            flags.add("noisy_timing")
            warnings.append(f"{card.id}: its time is not trustworthy, the machine was busy: {noisy[0]}")
    except Exception as exc:  # noqa: BLE001 - a card whose replay fails is reported, not fatal
        flags.add("replay_failed")
        warnings.append(f"{card.id}: replaying the reference failed: {type(exc).__name__}: {exc}")
    card.floor_us = roofline.floor_us(card.bytes, card.flops, card.dtype, ceil)
    if card.time_us is not None:
        card.share = card.total_us / forward_us if forward_us > 0 else None
        card.headroom = card.time_us / card.floor_us if card.floor_us else None
    card.flags = sorted(flags)
    return card
