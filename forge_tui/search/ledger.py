"""Money, accounted before it is spent: caps per run and per card that are checked before every
query and never exceeded, with several conversations in flight at once.

A conversation *reserves* the most its next query can cost (every input token at the dearest
input price, the whole output allowance at the output price); the reservation is refused when it
would take the card's or the run's spending (settled plus reserved) past its cap. After the query
the reservation is *settled* at the real cost, and what was not used goes back. Only spending
within caps can therefore happen, whatever the order in which conversations finish.

The search owns one ledger (started from what earlier runs recorded) and hands it to proposers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


class LimitReached(Exception):
    """A cap would be passed: the query is not made. The message says which cap."""


@dataclass
class Reservation:
    card: str
    amount: float
    settled: bool = False


class Ledger:
    def __init__(self, run_cap_usd: float, card_cap_usd: float | None = None, *, spent_usd: float = 0.0,
                 spent_by_card: dict[str, float] | None = None) -> None:
        """Caps of 0 (or None for the card's) mean none. ``spent_*``: what earlier runs spent."""
        self.run_cap = run_cap_usd
        self.card_cap = card_cap_usd
        self._spent = spent_usd
        self._by_card: dict[str, float] = dict(spent_by_card or {})
        self._reserved = 0.0
        self._reserved_by_card: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def spent(self) -> float:
        with self._lock:
            return self._spent

    def spent_on(self, card: str) -> float:
        with self._lock:
            return self._by_card.get(card, 0.0)

    def headroom(self, card: str) -> float:
        """What one more query on the card may cost at most (inf without caps)."""
        with self._lock:
            return self._headroom(card)

    def _headroom(self, card: str) -> float:
        room = float("inf")
        if self.run_cap > 0:
            room = self.run_cap - self._spent - self._reserved
        if self.card_cap:
            room = min(room, self.card_cap - self._by_card.get(card, 0.0) - self._reserved_by_card.get(card, 0.0))
        return max(room, 0.0)

    def why_not(self, card: str, amount: float = 0.0) -> str | None:
        """Why a query costing up to ``amount`` cannot be made on the card now, or None."""
        with self._lock:
            return self._why_not(card, amount)

    def _why_not(self, card: str, amount: float) -> str | None:
        if self.run_cap > 0 and self._spent + self._reserved + amount > self.run_cap:
            return (f"the run's money cap (${self.run_cap:.2f}): ${self._spent:.4f} spent, "
                    f"${self._reserved:.4f} reserved by queries in flight, the next may cost ${amount:.4f}")
        if self.card_cap:
            c, r = self._by_card.get(card, 0.0), self._reserved_by_card.get(card, 0.0)
            if c + r + amount > self.card_cap:
                return (f"the card's money cap (${self.card_cap:.2f}): ${c:.4f} spent on it, ${r:.4f} reserved, "
                        f"the next query may cost ${amount:.4f}")
        return None

    def reserve(self, card: str, amount: float) -> Reservation:
        with self._lock:
            why = self._why_not(card, amount)
            if why is not None:
                raise LimitReached(why)
            self._reserved += amount
            self._reserved_by_card[card] = self._reserved_by_card.get(card, 0.0) + amount
            return Reservation(card, amount)

    def settle(self, res: Reservation, actual: float) -> None:
        """The query cost ``actual`` (it may exceed the reservation only if the provider billed
        more tokens than it was allowed: recorded as spent all the same)."""
        with self._lock:
            if res.settled:
                return
            res.settled = True
            self._reserved -= res.amount
            self._reserved_by_card[res.card] = self._reserved_by_card.get(res.card, 0.0) - res.amount
            self.charge_locked(res.card, actual)

    def charge(self, card: str, amount: float) -> None:
        """Spending that happened outside a reservation (recovered from an interrupted run)."""
        with self._lock:
            self.charge_locked(card, amount)

    def charge_locked(self, card: str, amount: float) -> None:
        self._spent += amount
        self._by_card[card] = self._by_card.get(card, 0.0) + amount
