"""The one human formatter of an evaluation result: the CLI, the agent's tools and the app show it."""

from __future__ import annotations

from .result import EvalResult


def summary_line(r: EvalResult) -> str:
    """One line: status, card, backend and the reason or the speedup."""
    head = f"{r.status.upper()}: {r.card} on {r.backend}"
    if r.reason:
        return f"{head}: {r.reason}"
    if r.speedup_vs_eager is not None:
        return f"{head}: {r.speedup_vs_eager:.3f}x eager"
    return head


def format_result(r: EvalResult) -> str:
    """Every part of a result a person reads, a line or a few each."""
    lines = [f"{r.status.upper()}: {r.card} on {r.backend}" + (f": {r.reason}" if r.reason else "")]
    for f in r.static.findings if r.static else []:
        lines.append(f"  static {f.severity}: " + (f"line {f.line}: " if f.line else "") + f"{f.message} [{f.rule}]")
    b = r.build
    if b:
        lines.append(f"  build: {'ok' if b.ok else 'failed'} in {b.seconds:.2f} s" + (" (cached)" if b.cached else ""))
        for d in b.diagnostics[:10]:
            lines.append(f"    {d}")
    c = r.correctness
    if c:
        sets = ", ".join(f"{s.name} ({s.determinism}{', degenerate' if s.degenerate else ''}"
                         f"{f', {s.eager_off} elements where eager is off the float64 result' if s.eager_off else ''})"
                         for s in c.sets)
        lines.append(f"  correct on: {sets}")
        if c.state_calls:
            lines.append(f"  no state kept across calls: {c.state_calls} calls on near-duplicate inputs, each "
                         "output its own input's")
    t = r.timing
    if t:
        lines.append(f"  time: candidate {t.candidate.median:.2f} µs (spread {100 * t.candidate.spread:.1f}%), "
                     f"eager {t.eager.median:.2f} µs" +
                     (f", torch.compile {t.compile.median:.2f} µs" if t.compile else "") +
                     (f" ({t.compile_device.median:.2f} µs of device time)" if t.compile_device else ""))
        sp = t.speedup_vs_eager
        untrusted = "" if t.quiet else " (NOT TRUSTED: the machine was busy)"
        sure = (f" (95% interval of the median [{t.speedup_interval[0]:.3f}, {t.speedup_interval[1]:.3f}], "
                f"{sp.n} paired samples)" if len(t.speedup_interval) == 2 else "")
        lines.append(f"  speedup vs eager {sp.median:.3f}x [{sp.q1:.3f}, {sp.q3:.3f}]{sure}" +
                     (f", vs torch.compile {t.speedup_vs_compile.median:.3f}x"
                      + (" (its device time)" if t.compile_basis == "device" else "")
                      if t.speedup_vs_compile else
                      f" (torch.compile: {t.compile_note})") + untrusted)
        for why in t.noisy_reasons:
            lines.append(f"    busy: {why}")
        if t.threads_note:
            lines.append(f"    load: {t.threads_note}")
        for why in t.load_notes:
            lines.append(f"    load (delayed the verdict, did not deny it): {why}")
        lines.append(f"  roofline floor {t.floor_us:.2f} µs ({100 * t.fraction_of_floor:.0f}% of it reached); "
                     f"noise between two timing blocks {100 * t.noise:.1f}%; {t.checked_timed_runs} timed calls "
                     f"checked, each on fresh inputs ({t.calls_per_sample} per sample)" +
                     (f"; {t.eager_off} of their elements where eager is off the float64 result" if t.eager_off else ""))
    if r.confinement:
        conf = r.confinement
        lines.append(f"  ran confined: seccomp {str(conf.get('seccomp', '?')).split(':')[0]}, {conf.get('landlock')}")
    p = r.profile
    if p:
        if p.available:
            lines.append(f"  ncu: {p.duration_us:.2f} µs, DRAM {p.dram_throughput_pct}%, SM {p.sm_throughput_pct}%, "
                         f"occupancy {p.achieved_occupancy_pct}%, {p.registers_per_thread} regs/thread")
        else:
            lines.append(f"  {p.reason}")
    return "\n".join(lines)
