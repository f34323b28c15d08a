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
from .capture import Bucket, CaptureOptions, Recorder


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
                     progress: Callable[[str], None] = lambda msg: None) -> ProfileResult:
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
    with torch.no_grad():
        workload.run(model, inputs)  # warm-up, and the model's own errors surface here
        progress("capturing operator calls")
        rec = Recorder(model, CaptureOptions(cfg.profile))
        for _ in range(cfg.profile.forwards):
            rec.run(functools.partial(workload.run, model, inputs))
        progress("timing the forward")
        fwd_stats, noisy = quiet.time("forward", functools.partial(model, *inputs), host_load=True)
        if noisy:
            warnings.append("the forward's time is not trustworthy, the machine was busy: " + "; ".join(noisy)
                            + " (shares and times below are suspect; profile again on a quiet machine)")
        del model, inputs  # free the activations before the cards are replayed
        buckets = sorted(rec.buckets.values(), key=lambda b: b.first_seen)
        cards: list[Card] = []
        for i, b in enumerate(buckets, 1):
            progress(f"timing card {i}/{len(buckets)}: {b.target}")
            cards.append(_make_card(b, device, quiet, store, ceil, cfg.profile.forwards, fwd_stats.median, warnings,
                                    within=_within(b, rec.buckets)))
    for card in cards:
        if card.share is not None and card.share > 1.0:
            # a card cannot take longer than the whole forward: its time or the forward's is wrong
            card.flags = sorted({*card.flags, "share_over_forward"})
            warnings.append(f"{card.id}: timed at {100 * card.share:.0f}% of the forward, more than all of it: its "
                            f"time ({card.time_us:.1f} µs x {card.calls} calls) or the forward's "
                            f"({fwd_stats.median:.1f} µs) was disturbed; profile again on a quiet machine")
    cards.sort(key=lambda c: (-(c.share or 0.0), c.id))
    return ProfileResult(
        cards=cards, forward=fwd_stats, device=device, device_name=ceil["device_name"],
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else (
            str(workload.default_dtype).removeprefix("torch.") if workload.default_dtype is not None else None),
        ceilings=ceil, skipped=dict(rec.skipped), timing={**timer.describe(), "threads": threads},
        calls_total=rec.seq,
        warnings=warnings, forward_noisy=noisy,
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
