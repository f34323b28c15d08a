"""What ``bench`` returns: the variants' times, their paired speedups, whether their outputs agree,
the bounds the served cards promise and what the switch-off did; its JSON and its table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..timing import Stats

FRESH_COMPILE = "compile+forge/compile (own process)"
"""The speedup key of torch.compile / torch.compile + forge timed in a process of their own
(``fresh_compile_pair``), where the bench's process kept forge's kernels in compiled models."""


AFTER_SWITCH_OFF = "eager+forge after the switch-off"
"""The speedup key of eager / eager + forge re-measured with the kernels a switch-off left on."""


@dataclass
class BenchResult:
    device: str
    times: dict[str, Stats]
    speedups: dict[str, Stats]
    """Paired ratios against eager (and "compile+forge" against "compile")."""
    outputs_agree: dict[str, str | None]
    """None where the variant's outputs match eager's within tolerance, else what differs."""
    bound: float | None
    """1 / (1 - sum of share x (1 - 1/speedup)) over the served cards: what isolation promises."""
    served: dict[str, int]
    switched_off: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Variants whose outputs missed the element tolerance, judged instead against the model run in
    fp32: their relative error and that of the output they were checked against ("error",
    "baseline_error", "baseline", "outside": what missed the tolerance)."""
    served_compiled: dict[str, int] = field(default_factory=dict)
    """Calls served per card in the torch.compile + forge forwards (custom ops and the cards served
    in the compiled graphs): these cards decide where torch.compile + forge must beat
    torch.compile, not those eager + forge serves (ResNet-50's batch norms are served only there:
    op by op they are folded into the convolutions)."""
    compile_bound: float | None = None
    """What the cards served under torch.compile promise over torch.compile's forward, from their
    isolated speedups over torch.compile's own kernels (``compile_bound``)."""
    units: list[dict[str, Any]] = field(default_factory=list)
    """Per switch-off unit, what it saves in the model against what isolation promises: "cards",
    "with_us" and "without_us" (the forward with every served kernel and without the unit's,
    medians of one interleaved measurement), "promised_us" (the unit's share of eager's forward
    times 1 - 1/speedup, summed over its cards; None where a card lacks either), and
    "promised_own_us" (what the cards' own times promise, ``own_saved_us``)."""
    own_times: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per card its kernel served, eager's ops for the card and the served call, µs a call each,
    timed in this process on the card's captured inputs (``card_own_us``: on cuda the device's
    time alone, the host out)."""
    own_bound: float | None = None
    """The bound from those times (``own_bound``): what the cards save where the forward waits on
    its device, not on its host."""
    bound_basis: str = "isolation"
    """Which bound the forward's speedup is held to: "own times" where the forward is bound by its
    device (``bound_basis``), else "isolation" (``bound``)."""

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "times_us": {k: v.to_json() for k, v in self.times.items()},
                "speedups": {k: v.to_json() for k, v in self.speedups.items()}, "outputs_agree": self.outputs_agree,
                "bound": self.bound, "served": self.served, "switched_off": self.switched_off, "notes": self.notes,
                "accuracy": self.accuracy, "served_compiled": self.served_compiled,
                "compile_bound": self.compile_bound, "units": self.units,
                "own_times_us": {c: list(v) for c, v in self.own_times.items()}, "own_bound": self.own_bound,
                "bound_basis": self.bound_basis}

    def all_switched_off(self) -> bool:
        """Whether the op-by-op verdict switched off every kernel the eager + forge forward served."""
        served = [c for c, n in self.served.items() if n]
        return bool(served) and all(c in self.switched_off for c in served)

    def forge_mismatches(self) -> dict[str, str]:
        """The forge variants whose outputs do not agree (torch.compile's own differences from
        eager are reported in the table but are not forge's)."""
        return {k: v for k, v in self.outputs_agree.items() if v and "forge" in k}

    def table(self) -> str:
        lines = [f"{'variant':18s} {'median µs':>11s} {'q1 - q3':>19s} {'vs eager':>9s}  outputs"]
        for name, st in self.times.items():
            sp = self.speedups.get(name)
            agree = self.outputs_agree.get(name)
            acc = self.accuracy.get(name)
            said = "agree" if agree is None else agree
            if agree is None and acc:
                said = (f"as accurate as {acc['baseline']} against the model in fp32 (relative error "
                        f"{acc['error']:.3g} vs {acc['baseline_error']:.3g}); outside the element tolerance: "
                        f"{acc['outside']}")
            lines.append(f"{name:18s} {st.median:11.1f} {st.q1:9.1f} - {st.q3:7.1f} "
                         f"{(f'{sp.median:.3f}x' if sp else '-'):>9s}  {said}")
        if "compile+forge/compile" in self.speedups:
            bound = (f" (bound from the cards served there, their isolated speedups over torch.compile's kernels "
                     f"and their time: {self.compile_bound:.3f}x)" if self.compile_bound else "")
            lines.append(f"torch.compile + forge vs torch.compile: {self.speedups['compile+forge/compile'].median:.3f}x"
                         + bound)
        if (own := self.speedups.get(FRESH_COMPILE)) is not None:
            lines.append(f"torch.compile + forge vs torch.compile in a process of their own: {own.median:.3f}x "
                         f"[{own.q1:.3f}, {own.q3:.3f}] (the verdict's)")
        g = self.speedups.get("graphs: forge/eager")
        if g:
            lines.append(f"in CUDA graphs, eager + forge vs eager: {g.median:.3f}x [{g.q1:.3f}, {g.q3:.3f}]")
        sp = self.speedups.get("eager+forge")

        def reached(bound: float) -> str:
            return f"{sp.median:.3f}x, {100 * (sp.median - 1) / (bound - 1):.0f}% of the way" if sp and bound > 1 else "-"

        if self.bound:
            lines.append(f"bound from the served cards' isolated speedups and shares: {self.bound:.3f}x "
                         f"(reached {reached(self.bound)})")
        if self.own_bound:
            clock = "device time, the host out" if self.device == "cuda" else "their time"
            lines.append(f"bound from the served cards' own times in this process (eager's ops against the served "
                         f"call, {clock}): {self.own_bound:.3f}x (reached {reached(self.own_bound)})")
        for card, (e, o) in self.own_times.items():
            lines.append(f"  {card}: eager's ops {e:.1f} µs a call, served {o:.1f}")
        if self.bound or self.own_bound:
            lines.append("the forward is held to the bound from " + (
                "the cards' own times: bound by its device, it waits on their device time alone"
                if self.bound_basis == "own times" else "isolation" + (
                    "" if "eager (graph)" in self.times or self.device != "cuda" else
                    " (without CUDA graphs, --graphs, the bench cannot tell whether the forward is bound by its device)")))
        for u in self.units:
            promised = f"; isolation promised {u['promised_us']:.0f}" if u.get("promised_us") is not None else ""
            if u.get("promised_own_us") is not None:
                promised += f", the cards' own times {u['promised_own_us']:.0f}"
            lines.append(f"in the model {' + '.join(u['cards'])} saved {u['without_us'] - u['with_us']:.0f} µs a forward "
                         f"({u['with_us']:.0f} with it, {u['without_us']:.0f} without){promised}")
        for card, why in self.switched_off.items():
            lines.append(f"switched off {card}: {why}")
        after = self.speedups.get(AFTER_SWITCH_OFF)
        if after:
            lines.append(f"eager + forge with the kernels left on: {after.median:.3f}x [{after.q1:.3f}, {after.q3:.3f}]")
        elif self.all_switched_off():
            lines.append("eager + forge serves none of its kernels now: the model runs eager's own code")
        lines.extend(self.notes)
        return "\n".join(lines)
