"""Cards whose profiled time is not trusted (``profiler.trust``), timed again once the machine is
quiet: the forward too where its own time was taken on a busy machine (every share divides by it),
then each such card on its captured inputs, with the profile's quietness checks. What comes out
trusted loses its flag, every share is recomputed; what does not stays flagged for the next try.
Nothing is timed while the machine is busy. Writing the cards back is the workspace's
(``workspace.retime_cards``): the profiler writes no workspace.

    outcome = retime(cards, summary, device="cpu", cfg=cfg, store=ws.store, workload=str(ws.root / "workload.py"))
    outcome.busy      # why nothing (or not everything) was timed, or None
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..cards import Card
from ..errors import ForgeError
from .trust import distrust

if TYPE_CHECKING:
    from ..config import ForgeConfig
    from ..tensorstore import TensorStore


@dataclass
class CardRetime:
    """What one try did."""

    retimed: list[str] = field(default_factory=list)
    """Cards now timed on a quiet machine (their flag removed)."""
    waiting: list[str] = field(default_factory=list)
    """Cards still untrusted after the try."""
    busy: str | None = None
    """Why the machine was too busy to time (everything) now; None where it was quiet."""
    forward_us: float | None = None
    """The forward's time, where it was timed again."""
    changed: bool = False
    """Whether the cards (and the profile) changed and are to be written back."""

    def line(self) -> str:
        if not self.retimed and not self.waiting:
            return "every card's time is trusted"
        done = f"timed {len(self.retimed)} card(s) again on a quiet machine" if self.retimed else ""
        left = (f"{len(self.waiting)} card(s) marked ? wait for a quiet machine" +
                (f" ({self.busy})" if self.busy else "")) if self.waiting else ""
        return "; ".join(p for p in (done, left) if p)


def untrusted(cards: list[Card]) -> list[Card]:
    """The cards to time again: untrusted, and replayable."""
    return [c for c in cards if distrust(c) is not None and "replay_failed" not in c.flags]


def retime(cards: list[Card], summary: dict, *, device: str, cfg: ForgeConfig, store: TensorStore,
           workload: str, dtype: str | None = None, progress: Callable[[str], None] = lambda line: None,
           stop: Callable[[], bool] = lambda: False) -> CardRetime:
    """One try (see the module's docstring), changing ``cards`` and ``summary`` (the profile's
    ``profile.json``) in place where something was timed (``CardRetime.changed``). ``workload``:
    the workload to build where the forward is timed again; ``stop``: asked between cards, true
    ends the try with what was timed so far."""
    import torch

    from ..inputs import random_inputs, sample_inputs
    from ..program import bind_program
    from ..quiet import Calibration
    from ..timing import Timer
    from .run import QuietTimer

    todo = untrusted(cards)
    forward_loud = bool(summary.get("forward_noisy"))
    if not todo and not forward_loud:
        return CardRetime()
    if device == "cpu":
        torch.set_num_threads(cfg.timing.threads or len(os.sched_getaffinity(0)))
    timer = Timer.from_config(device, cfg.timing)
    quiet = QuietTimer(timer, Calibration(device, timer), cfg.timing)
    busy = quiet.busy()
    if busy is not None:
        return CardRetime(waiting=[c.id for c in todo], busy=busy)
    forward_us = float((summary.get("forward_us") or {}).get("median") or 0.0)
    new_forward = None
    if forward_loud:
        progress("timing the forward again")
        stats, noisy = _time_forward(workload, device, dtype, cfg, quiet)
        if noisy:
            return CardRetime(waiting=[c.id for c in todo], busy=noisy[0])
        new_forward = forward_us = stats.median
        summary["forward_us"], summary["forward_noisy"] = stats.to_json(), []
    if forward_us <= 0:
        raise ForgeError("the profile records no forward time to share the cards' times against")
    done: list[str] = []
    loud: str | None = None
    for i, card in enumerate(todo, 1):
        if stop():
            break
        progress(f"timing card {i}/{len(todo)} again: {card.id}")
        ins = sample_inputs(card, store, 0, device) if card.samples else random_inputs(card, device, seed=0)
        with torch.no_grad():
            stats, noisy = quiet.time(card.op_name, bind_program(card.program, ins, device), host_load=True)
        if noisy:
            loud = noisy[0]
            break  # the machine got busy: the rest waits for the next try
        card.time_us, card.time_spread = stats.median, stats.spread
        card.flags = [f for f in card.flags if f != "noisy_timing"]
        done.append(card.id)
    if not done and new_forward is None:
        return CardRetime(waiting=[c.id for c in todo], busy=loud)
    for c in cards:
        if c.time_us is None:
            continue
        c.share = c.total_us / forward_us
        c.headroom = c.time_us / c.floor_us if c.floor_us else None
        flags = set(c.flags) - {"share_over_forward"}
        if c.share > 1.0:
            flags.add("share_over_forward")
        c.flags = sorted(flags)
    summary["warnings"] = [w for w in summary.get("warnings", []) if not any(w.startswith(f"{c}:") for c in done)]
    waiting = [c.id for c in untrusted(cards)]
    return CardRetime(retimed=[c for c in done if c not in waiting], waiting=waiting, busy=loud,
                      forward_us=new_forward, changed=True)


def _time_forward(spec: str, device: str, dtype: str | None, cfg: ForgeConfig, quiet) -> tuple:
    import torch

    from ..workload import load_workload, parse_dtype

    workload = load_workload(spec)
    model, inputs = workload.build(device, parse_dtype(dtype) if dtype else None)
    model.train(cfg.profile.train_mode)
    with torch.no_grad():
        workload.run(model, inputs)  # warm-up
        return quiet.time("forward", functools.partial(model, *inputs), host_load=True)
