"""Shared pieces for the search tests: synthetic workspaces, a fake evaluation pool, proposers."""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from forge_tui.cards import Card, TensorSpec, save_cards
from forge_tui.evaluator.result import EvalResult
from forge_tui.gitrepo import GitRepo
from forge_tui.search.proposer import Proposal
from forge_tui.workspace import GITIGNORE, MARKER, Workspace


def synthetic_card(card_id: str, share: float, time_us: float, floor_us: float) -> Card:
    spec = TensorSpec(shape=[4, 8], stride=[8, 1], dtype="float32")
    return Card(id=card_id, kind="op", target="aten._softmax.default", label=card_id, inputs=[spec],
                outputs=[spec.model_copy(update={"role": "output"})],
                program={"nodes": [{"op": "aten._softmax.default", "args": [{"$in": 0}, -1, False], "kwargs": {}}],
                         "outputs": [{"$node": 0, "out": 0}]},
                calls=1, time_us=time_us, share=share, floor_us=floor_us, headroom=time_us / floor_us)


def make_workspace(root: Path, cards: list[Card]) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(json.dumps({"tool": "forge-tui", "format": 1, "workload": {"name": "synthetic"},
                                           "device": "cpu", "device_name": "test"}))
    (root / ".gitignore").write_text(GITIGNORE)
    save_cards(cards, root / "cards")
    with GitRepo.init(root) as repo:
        repo.commit_worktree("synthetic workspace")
    return Workspace(root)


def stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process (``hash()`` of a str changes with
    PYTHONHASHSEED): fake speedups and statuses derived from it are reproducible."""
    return zlib.crc32(text.encode())


class FakePool:
    """Evaluations without compiling: the speedup is a function of (card, source)."""

    backend = "cpu"

    def __init__(self, speedup=lambda card, source: 1.1, delay=(0.0, 0.0), status=lambda card, source: "passed",
                 speedup_when=("passed",), times=None):
        self.speedup = speedup
        self.times = times
        """(card, source) -> (candidate µs, eager µs) of a passed result, or None: untimed."""
        self.speedup_when = speedup_when
        """Statuses whose results carry a speedup (the evaluator gives one to passed results only)."""
        self.delay = delay
        self.status = status
        self.calls: list[tuple[str, str]] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._exec = ThreadPoolExecutor(max_workers=8)

    def _run(self, card, source):
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self.calls.append((card.id, source))
        try:
            time.sleep(random.uniform(*self.delay))
            st = self.status(card, source)
            timing, time_us = None, None
            got = self.times(card, source) if self.times is not None and st == "passed" else None
            if got is not None:
                from forge_tui.evaluator.result import TimeStats, Timing

                cand, eager = got
                stats = [TimeStats(median=x, mean=x, min=x, max=x, q1=x, q3=x, n=5)
                         for x in (cand, eager, self.speedup(card, source))]
                timing, time_us = Timing(candidate=stats[0], eager=stats[1], speedup_vs_eager=stats[2]), cand
            return EvalResult(status=st, reason="" if st == "passed" else "fake failure", card=card.id,
                              backend=self.backend, timing=timing, time_us=time_us,
                              speedup_vs_eager=self.speedup(card, source) if st in self.speedup_when else None)
        finally:
            with self._lock:
                self._in_flight -= 1

    def submit(self, card, source, options=None) -> Future:
        return self._exec.submit(self._run, card, source)

    def check(self, card, source) -> Future:
        return self.submit(card, source)

    def profile(self, card, source) -> Future:
        return self.submit(card, source)

    def build(self, source) -> Future:
        from forge_tui.evaluator.result import BuildReport

        return self._exec.submit(lambda: BuildReport(ok=True, backend=self.backend, key="fake"))

    def close(self):
        self._exec.shutdown(wait=True)


class CountingProposer:
    """An endless supply of distinct proposals: 'k<i>' for each card."""

    name = "counting"

    def __init__(self, fail_every: int = 0):
        self.n = 0
        self.fail_every = fail_every
        self.contexts = []
        self._lock = threading.Lock()

    def supports(self, card, backend):
        return None

    def propose(self, ctx):
        with self._lock:
            self.n += 1
            n = self.n
            self.contexts.append(ctx)
        if self.fail_every and n % self.fail_every == 0:
            raise ConnectionError("LLM API unreachable")
        return Proposal(source=f"// kernel {n} for {ctx.card.id} from {ctx.parent.id}\n", move=f"k{n}")
