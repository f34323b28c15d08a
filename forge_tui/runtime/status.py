"""Live fallback status: per card, is its kernel active or disabled and why, how many calls it
served, and how many fell back to PyTorch for each reason.

The runtime keeps one ``StatusBoard`` per applied model and writes it to
``.forge/runtime/status.json`` in the workspace, where ``forge status`` and the app's fallback pane
read it: when a kernel is disabled, when the model is undone, and while calls happen at most once a
second, from a thread of its own, so that a served call never waits on the file system.
"""

from __future__ import annotations

import json
import operator
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUS_FILE = Path(".forge") / "runtime" / "status.json"


@dataclass
class CardStatus:
    card: str
    kind: str
    target: str
    active: bool = True
    disabled_reason: str = ""
    served: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    shadow_checks: int = 0
    dispatch_us: float | None = None
    """The guard's own cost per served call (checks, descriptors, outputs; not the launch)."""
    eager_call_us: float | None = None
    """Eager's own call of the module, timed where the dispatch looked too costly (``Guard.time_eager``)."""
    sites: list[str] = field(default_factory=list)
    """Where it is installed: module paths, or "ops under <path>"."""
    trial: dict[str, Any] | None = None
    """The in-place trial (``runtime.apply``): median µs a call with the kernel and without, the
    calls timed each way, and whether the kernel was kept."""
    traced_fallbacks: Counter[str] = field(default_factory=Counter)
    """Graphs compiled by torch.compile that run PyTorch's own code at the card's sites, by reason:
    the trace decides for all of a graph's calls, which are not counted one by one."""

    def to_json(self) -> dict[str, Any]:
        return {"card": self.card, "kind": self.kind, "target": self.target, "active": self.active,
                "disabled_reason": self.disabled_reason, "served": self.served,
                "fallbacks": dict(self.fallbacks), "shadow_checks": self.shadow_checks,
                "dispatch_us": self.dispatch_us, "eager_call_us": self.eager_call_us, "sites": self.sites,
                "trial": self.trial, "traced_fallbacks": dict(self.traced_fallbacks)}


class Tally:
    """Fallbacks that a caller counts by its own ``n += 1`` (no call, no lock): calls of a step that
    no card serves, which would otherwise each take the board's lock and a trip through
    ``fell_back``. The board folds ``n`` into the fallbacks of each of ``statuses`` still active, for
    ``reason``, before anything reads them (``StatusBoard.settle``). Only the caller writes ``n``
    and only the board ``folded``, so a fold on another thread loses no count; a model called on
    several threads at once may lose one to another's increment (a status figure, which no guard
    decides by)."""

    __slots__ = ("folded", "n", "reason", "statuses")

    def __init__(self, statuses: list[CardStatus], reason: str) -> None:
        self.statuses = statuses
        self.reason = reason
        self.n = 0
        self.folded = 0


_TALLY_N = operator.attrgetter("n")


class StatusBoard:
    def __init__(self, path: Path | None = None, min_interval_s: float = 1.0) -> None:
        self.cards: dict[str, CardStatus] = {}
        self.path = path
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._dirty = False
        """Counts changed since the last write (``_touch``)."""
        self._stop = threading.Event()
        self._tallies: list[Tally] = []
        """The counts callers keep themselves (``tally``), folded in by ``settle``."""
        self.served_total = 0
        self._direct = 0
        """Fallbacks counted one by one (``fell_back``, ``fell_back_each``), for ``pending``."""
        """Served calls of every card, as ``served`` counts them: what ``Passthrough`` compares
        before and after a call (``passthrough.py``)."""
        self._writer: threading.Thread | None = None
        """Writes the counts at most every ``min_interval_s`` while they change (``_write_loop``),
        started by the first count."""

    def card(self, card: str, kind: str, target: str) -> CardStatus:
        with self._lock:
            if card not in self.cards:
                self.cards[card] = CardStatus(card, kind, target)
            return self.cards[card]

    def served(self, st: CardStatus) -> None:
        with self._lock:
            st.served += 1
            self.served_total += 1
        self._touch()

    def fallback_counts(self) -> dict[tuple[str, str], int]:
        """Every active card's fallbacks by (card, reason), the tallies folded in first."""
        with self._lock:
            self._settle_locked()
            return {(c.card, why): n for c in self.cards.values() if c.active for why, n in c.fallbacks.items()}

    def fallback_events(self) -> tuple[int, int]:
        """Fallbacks counted so far: (one by one, by the tallies), a tally's count once whatever
        cards it folds into. Read without the lock or a fold (``Passthrough`` compares them before
        and after a call): the tallies count the refusals their callers remember (a shape a card
        refused before), the others the refusals still being judged or learned, and the calls a
        guard holds back for a reason of its own (eager's call timed for the dispatch check)."""
        return self._direct, sum(map(_TALLY_N, self._tallies))

    def fell_back(self, st: CardStatus, reason: str) -> None:
        with self._lock:
            st.fallbacks[reason] += 1
            self._direct += 1
        self._touch()

    def fell_back_each(self, statuses: list[CardStatus], reason: str) -> None:
        """``fell_back`` for each active card of ``statuses`` (a scope's call that served none of
        its cards), under one lock."""
        with self._lock:
            for st in statuses:
                if st.active:
                    st.fallbacks[reason] += 1
                    self._direct += 1
        self._touch()

    def tally(self, statuses: list[CardStatus], reason: str) -> Tally:
        """A count of fallbacks of ``statuses`` for ``reason`` that the caller keeps itself
        (``Tally``), folded into the statuses by ``settle``; starts the writer as a count does."""
        t = Tally(statuses, reason)
        with self._lock:
            self._tallies.append(t)
        self._touch()
        return t

    def settle(self) -> None:
        """Fold the tallies' new counts into their statuses (each still active)."""
        with self._lock:
            self._settle_locked()

    def _settle_locked(self) -> None:
        for t in self._tallies:
            n = t.n - t.folded
            if n:
                t.folded += n
                for st in t.statuses:
                    if st.active:
                        st.fallbacks[t.reason] += n

    def traced_fallback(self, st: CardStatus, reason: str) -> None:
        with self._lock:
            st.traced_fallbacks[reason] += 1
        self._touch()

    def checked(self, st: CardStatus, bad: str | None, first: bool) -> bool:
        """Record a check of a served call against the model's own (the first call's, or a shadow
        check): a mismatch ``bad`` disables the card and counts the call as fallen back. Returns
        whether the served output may be used."""
        if not first:
            with self._lock:
                st.shadow_checks += 1
        if bad is None:
            return True
        self.disable(st, f"{'first-call' if first else 'shadow'} check: {bad}")
        self.fell_back(st, "check mismatch")
        return False

    def disable(self, st: CardStatus, reason: str) -> None:
        with self._lock:
            self._settle_locked()  # what was counted while it was active stays its own
            if st.active:
                st.active = False
                st.disabled_reason = reason
        self.write()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._settle_locked()
            return {"pid": os.getpid(), "started_at": self.started_at, "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "cards": [c.to_json() for c in self.cards.values()]}

    def _touch(self) -> None:
        """A count changed: the writer thread writes it within ``min_interval_s``, never the
        caller (a served call)."""
        if self.path is None:
            return
        self._dirty = True
        if self._writer is None and not self._stop.is_set():
            with self._lock:
                if self._writer is not None:
                    return
                self._writer = threading.Thread(target=self._write_loop, name="forge-status", daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        while not self._stop.wait(self.min_interval_s):
            if self._dirty or any(t.n != t.folded for t in self._tallies):
                self.write()

    def close(self) -> None:
        """Stop the writer thread and write the counts as they stand (the model is undone)."""
        self._stop.set()
        writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout=5.0)
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self._dirty = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.snapshot(), indent=1))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only workspace: the status stays queryable in the process


def read_status(workspace_root: Path) -> dict[str, Any] | None:
    path = Path(workspace_root) / STATUS_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def format_status(data: dict[str, Any]) -> str:
    """The table ``forge status`` prints."""
    lines = [f"runtime status (process {data.get('pid')}, started {data.get('started_at')}, "
             f"updated {data.get('updated_at')})"]
    for c in data.get("cards", []):
        state = "active" if c["active"] else f"DISABLED: {c['disabled_reason']}"
        fb = ", ".join(f"{n} {why}" for why, n in sorted(c["fallbacks"].items(), key=lambda x: -x[1])) or "none"
        lines.append(f"  {c['card']} ({c['kind']} {c['target']}): {state}; served {c['served']}, "
                     f"fell back: {fb}" + (f"; {c['shadow_checks']} shadow checks" if c.get("shadow_checks") else "")
                     + (f"; dispatch {c['dispatch_us']:.1f} µs a call" if c.get("dispatch_us") else "")
                     + (f" (eager's own call {c['eager_call_us']:.1f})" if c.get("eager_call_us") else "")
                     + (f"; in place {t['with_us']:.1f} µs a call with it, {t['without_us']:.1f} without"
                        if (t := c.get("trial")) else "")
                     + ("; compiled graphs running PyTorch's code here: " + ", ".join(
                         f"{n} ({why})" for why, n in sorted(tf.items(), key=lambda x: -x[1]))
                        if (tf := c.get("traced_fallbacks")) else ""))
        for s in c.get("sites", []):
            lines.append(f"      at {s}")
    if not data.get("cards"):
        lines.append("  no promoted kernel is applied")
    return "\n".join(lines)
