"""Where evaluations run: the ``EvalPool`` protocol, and the local pool.

What a proposer or the agent's tools ask of a pool: ``build`` (the compiler's diagnostics, no run),
``check`` (correctness on every input set, no timing), ``submit`` (the full evaluation) and
``profile`` (the full evaluation plus Nsight Compute), each a Future. ``LocalEvalPool`` builds on
the CPU cores (many compiles at once) and runs candidates on one judge process per GPU (or one on
the CPU backend); ``forge_tui.cluster.pool.DaskEvalPool`` sends the same calls to the workers of a
Dask cluster (one per GPU) without touching the search or the agent.

A pool that can evaluate nothing more (a cluster whose scheduler went away) fails its Futures with
``PoolLost``: the search then stops with that reason and records nothing for the evaluations in
flight, so ``forge search --resume`` runs them again.
"""

from __future__ import annotations

import os
import queue
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from ..cards import Card
from ..config import ForgeConfig
from ..evaluator import EvalOptions, EvalResult, Evaluator
from ..evaluator.api import resolve_backend
from ..evaluator.build import Builder
from ..evaluator.result import BuildReport
from ..tensorstore import TensorStore


class PoolLost(RuntimeError):
    """The pool cannot evaluate any more (its reason is the message): not the candidate's fault,
    so nothing is recorded for the evaluation; the search stops and can be resumed."""


class EvalPool(Protocol):
    backend: str

    def build(self, source: str) -> "Future[BuildReport]":
        """Compile only: the library, or the compiler's parsed diagnostics."""
        ...

    def check(self, card: Card, source: str) -> "Future[EvalResult]":
        """Correctness on every input set, without timing."""
        ...

    def submit(self, card: Card, source: str, options: EvalOptions | None = None) -> "Future[EvalResult]":
        """The full evaluation (options as for ``Evaluator.evaluate``)."""
        ...

    def profile(self, card: Card, source: str) -> "Future[EvalResult]":
        """The full evaluation with Nsight Compute's report (or why there is none)."""
        ...

    def close(self) -> None: ...


class LocalEvalPool:
    def __init__(self, store: TensorStore, cache_dir: Path, config: ForgeConfig, *, backend: str | None = None,
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

    def _run(self, card: Card, source: str, options: EvalOptions | None) -> EvalResult:
        self.builder.build(source)  # compile while another candidate holds a worker (cached afterwards)
        ev = self._evaluators.get()
        try:
            return ev.evaluate(card, source, options)
        finally:
            self._evaluators.put(ev)

    def build(self, source: str) -> "Future[BuildReport]":
        return self._exec.submit(lambda: BuildReport.model_validate(self.builder.build(source).to_json()))

    def check(self, card: Card, source: str) -> "Future[EvalResult]":
        return self.submit(card, source, EvalOptions(timing=False))

    def submit(self, card: Card, source: str, options: EvalOptions | None = None) -> "Future[EvalResult]":
        return self._exec.submit(self._run, card, source, options)

    def profile(self, card: Card, source: str) -> "Future[EvalResult]":
        return self.submit(card, source, EvalOptions(profile=True))

    def close(self) -> None:
        self._exec.shutdown(wait=True, cancel_futures=True)
        for ev in self._all:
            ev.close()

    def kill(self) -> None:
        """End every evaluation in flight at once, waiting for none (a process about to exit): the
        queued ones are cancelled and each judge's process group (the judge and the candidate it
        runs) is killed."""
        self._exec.shutdown(wait=False, cancel_futures=True)
        for ev in self._all:
            proc = ev.worker.proc
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the judge leads a session of its own
                except OSError:
                    pass
