"""Answers: what does a call of a kernel registered as a custom op cost the host, the way
``torch.library.custom_op`` registers it against the library's own API (``Library.define`` and
``Library.impl`` for every backend)? The kernel here is a 4.5 µs identity, so the rest is the
registration's own cost.

Answer on the development machine's CPU (2026-12-04, torch 2.13.0): 21.1-21.6 µs a call through
``custom_op`` (its autograd and backend layers run in Python), 9.0-9.4 through ``Library.impl``;
inside an inductor graph 36.2-36.8 against 25.0-26.8. ``apply``'s custom ops have used the
library's API since then (a compiled ResNet-50 makes 53 such calls a forward).

    python bench/lab/custom_op_cost.py
"""

from __future__ import annotations

import time

import torch


def per_call_us(f, n: int = 20000) -> float:
    for _ in range(500):
        f()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t0) / n / 1000


def main() -> None:
    x = torch.randn(16)

    def impl(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [inputs[0] * 1]

    def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.empty_like(inputs[0])]

    op = torch.library.custom_op("costprobe::a", impl, mutates_args=(), schema="(Tensor[] inputs) -> Tensor[]")
    op.register_fake(fake)
    lib = torch.library.Library("costprobe2", "FRAGMENT")
    lib.define("b(Tensor[] inputs) -> Tensor[]")
    lib.impl("b", impl, "CompositeExplicitAutograd")
    torch.library.register_fake("costprobe2::b", fake, lib=lib)
    a, b = torch.ops.costprobe.a.default, torch.ops.costprobe2.b.default

    def via_a(t: torch.Tensor) -> torch.Tensor:
        return a([t])[0] + 1

    def via_b(t: torch.Tensor) -> torch.Tensor:
        return b([t])[0] + 1

    ca, cb = torch.compile(via_a), torch.compile(via_b)
    with torch.no_grad():
        ca(x), cb(x)
        print(f"{'':10s} {'kernel':>8s} {'custom_op':>10s} {'Library':>8s}   (µs a call)")
        for _ in range(3):
            print(f"{'direct':10s} {per_call_us(lambda: impl([x])):8.2f} {per_call_us(lambda: a([x])):10.2f} "
                  f"{per_call_us(lambda: b([x])):8.2f}")
        for _ in range(2):
            print(f"{'inductor':10s} {'':8s} {per_call_us(lambda: ca(x), 5000):10.2f} {per_call_us(lambda: cb(x), 5000):8.2f}")


if __name__ == "__main__":
    main()
