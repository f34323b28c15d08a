"""Where evaluations run: a pool with ``submit(card, source, options) -> Future``.

``LocalEvalPool`` builds on the CPU cores (many compiles at once) and runs candidates on one
worker process per GPU (or one on the CPU backend). The search only sees ``submit`` and
``close``, so a pool that sends the same calls to a cluster (Ray actors, one per GPU) can
replace it without touching the search.
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from ..cards import Card
from ..config import ForgeConfig
from ..evaluator import EvalOptions, Evaluator
from ..evaluator.api import resolve_backend
from ..evaluator.build import Builder


class EvalPool(Protocol):
    backend: str

    def submit(self, card: Card, source: str, options: EvalOptions | None = None) -> Future: ...

    def close(self) -> None: ...


class LocalEvalPool:
    def __init__(self, store, cache_dir, config: ForgeConfig, *, backend: str | None = None,
                 workers: int | None = None) -> None:
        n = workers or config.search.workers
        self.backend = resolve_backend(backend or config.evaluator.backend)
        self._evaluators: queue.Queue[Evaluator] = queue.Queue()
        self._all: list[Evaluator] = []
        for i in range(n):
            env = {"CUDA_VISIBLE_DEVICES": str(i)} if self.backend == "cuda" and n > 1 else None
            ev = Evaluator(store, cache_dir, config, backend=self.backend, worker_env=env)
            self._all.append(ev)
            self._evaluators.put(ev)
        self.builder: Builder = self._all[0].builder
        builds = config.evaluator.parallel_builds or os.cpu_count() or 1
        self._exec = ThreadPoolExecutor(max_workers=n + builds, thread_name_prefix="forge-eval")

    def _run(self, card: Card, source: str, options: EvalOptions | None) -> dict:
        self.builder.build(source)  # compile while another candidate holds a worker (cached afterwards)
        ev = self._evaluators.get()
        try:
            return ev.evaluate(card, source, options)
        finally:
            self._evaluators.put(ev)

    def submit(self, card: Card, source: str, options: EvalOptions | None = None) -> Future:
        return self._exec.submit(self._run, card, source, options)

    def close(self) -> None:
        self._exec.shutdown(wait=True, cancel_futures=True)
        for ev in self._all:
            ev.close()
