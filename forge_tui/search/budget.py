"""Spending evaluations across cards by expected end-to-end gain, not uniformly.

A card's potential is the share of the forward it could still remove:
``share x (1 - floor / best time)``, where the best time is the eager time over the best
speedup found so far. The next evaluation goes to the card with the largest potential per
evaluation already spent on it (``potential / (1 + evaluations)``), so cards receive evaluations
roughly in proportion to what they can return. A card stops at its floor, when what is left
is too small, when its own budget is spent, when its tree is exhausted, or when its proposer
keeps failing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cards import Card


@dataclass
class CardBudget:
    card: Card
    evals: int = 0
    in_flight: int = 0
    best_speedup: float = 1.0
    failures_in_row: int = 0
    finished: str | None = None

    @property
    def best_time_us(self) -> float | None:
        return None if self.card.time_us is None else self.card.time_us / max(self.best_speedup, 1e-9)

    @property
    def floor_trusted(self) -> bool:
        """False when eager already runs under the floor (a CPU whose caches hold the data): the
        floor then bounds nothing and must not stop the card."""
        return bool(self.card.floor_us and self.card.time_us and self.card.time_us >= self.card.floor_us)

    @property
    def floor_fraction(self) -> float:
        t = self.best_time_us
        if not (t and self.floor_trusted and self.card.floor_us):
            return 0.0
        return self.card.floor_us / t

    @property
    def potential(self) -> float:
        share = self.card.share or 0.0
        return share * max(0.0, 1.0 - self.floor_fraction)

    @property
    def priority(self) -> float:
        return self.potential / (1 + self.evals + self.in_flight)

    def stop_reason(self, cfg) -> str | None:
        if self.floor_fraction >= cfg.floor_fraction:
            return f"reached {100 * self.floor_fraction:.0f}% of the roofline floor"
        if self.potential < cfg.min_gain:
            return (f"what is left to gain ({100 * self.potential:.2f}% of the forward) is below min_gain "
                    f"({100 * cfg.min_gain:.2f}%)")
        if self.evals >= cfg.evals_per_card:
            return f"its budget of {cfg.evals_per_card} evaluations is spent"
        if self.failures_in_row >= cfg.proposer_failures:
            return f"the proposer failed {self.failures_in_row} times in a row"
        return None


def pick(budgets: list[CardBudget]) -> CardBudget | None:
    """The open card with the highest priority (ties: higher share, then id)."""
    open_ = [b for b in budgets if b.finished is None]
    if not open_:
        return None
    return max(open_, key=lambda b: (b.priority, b.card.share or 0.0, b.card.id))
