"""``DaskEvalPool``: the ``EvalPool`` protocol on the workers of a Dask cluster.

Each evaluation is one Dask task (``worker.evaluate``) that holds one unit of the backend's worker
resource (``GPU=1`` per GPU worker, ``CPU=1`` per cpu worker), so a worker runs one at a time.
What travels is the candidate's source, the card, the options and the configuration; the card's
captured tensors travel as Dask data, one datum per content hash, sent once to each worker that
can run the backend and checked against the hash there. Results come back as the typed
``EvalResult`` with ``worker``: the host, address and device that ran it.

A monitor thread polls the scheduler: it probes each worker that joins (``worker.probe``) and
refuses those that cannot judge (several GPUs in one process, no GPU, no confinement, another
forge-tui), follows the evaluations in flight (which worker runs each, how many workers died
under it), and publishes ``ClusterStatus`` and ``WorkerChanged`` events.

Faults: a worker that dies mid-evaluation makes the scheduler run it again elsewhere; after
``[pool] retries`` such deaths the evaluation ends as an ``error`` with the workers that died
(the scheduler's own limit, ``distributed.scheduler.allowed-failures``, ends it the same way if it
is lower). A scheduler that goes away fails every evaluation in flight with ``PoolLost``.

Timing across machines: every speedup is measured on the worker that ran it. Where the workers
that can run the backend differ in device (GPU model, or CPU model), each card is pinned to one
device (the one with the most workers when the card first needs it): all of a card's evaluations,
its best included, are timed on that device, named in ``ClusterStatus.pinned`` and in each result.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..cards import Card
from ..config import ForgeConfig
from ..errors import ForgeError
from ..evaluator import EvalOptions, EvalResult
from ..evaluator.result import BuildReport
from ..search.events import EventBus, SearchEvent
from ..search.pool import PoolLost
from ..tensorstore import TensorStore
from . import worker as remote
from .events import ClusterStatus, EvalInFlight, WorkerChanged, WorkerView


@dataclass
class _Eval:
    card: Card
    source: str
    options: EvalOptions | None
    out: "Future[EvalResult]"
    submitted: float
    key: str = ""
    dfut: Any = None
    worker: str = ""
    deaths: int = 0
    """Workers that died while running it (over every submission)."""
    base_deaths: int = 0
    """Deaths before its current submission (a resubmitted evaluation keeps its count)."""
    died_on: list[str] = field(default_factory=list)
    restricted: tuple[str, ...] | None = None
    resend: bool = False
    """Dropped by the scheduler with its tensors: the monitor sends it again once a worker is there."""


def _task_states(keys: list[str], dask_scheduler: Any = None) -> dict[str, tuple[str, str, int]]:
    """On the scheduler: (state, worker running it, workers that died under it) per key."""
    out = {}
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        if ts is not None:
            out[k] = (ts.state, ts.processing_on.address if ts.processing_on is not None else "", ts.suspicious)
    return out


def _by_value(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a function the scheduler can run without importing forge_tui (pickled by value)."""
    import types

    return types.FunctionType(fn.__code__, {}, fn.__name__, fn.__defaults__)


def scheduler_address(text: str) -> str:
    """A scheduler address as given (``tcp://HOST:8786``, ``HOST:8786``), or a ForgeError naming why not."""
    text = text.strip()
    if not text:
        raise ForgeError("the Dask scheduler's address is empty (tcp://HOST:8786)")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    host, _, port = rest.rpartition(":")
    if scheme not in ("tcp", "tls", "ucx", "inproc") or (scheme != "inproc" and (not host or not port.isdigit())):
        raise ForgeError(f"not a Dask scheduler address: {text!r} (expected tcp://HOST:PORT, e.g. tcp://gpu-box:8786)")
    return f"{scheme}://{rest}"


def workers_for(card: str, devices: dict[str, str], others: bool, pinned: dict[str, str]) -> tuple[str, ...] | None:
    """The workers a card's evaluation may run on, of the usable ones (``devices``: address ->
    device): None (any worker with the resource) unless the usable ones differ in device, where
    the card keeps to one (``pinned``, updated: the device with the most workers when the card
    first needs one, or again once none of its device is left), or ``others`` (workers with the
    resource that must not run it) exist."""
    if len(set(devices.values())) > 1:
        count = Counter(devices.values())
        if pinned.get(card) not in count:
            pinned[card] = min(count, key=lambda d: (-count[d], d))
        return tuple(sorted(a for a, d in devices.items() if d == pinned[card]))
    if others and devices:
        return tuple(sorted(devices))
    return None


class DaskEvalPool:
    """Evaluations on a Dask cluster. ``scheduler``: its address; ``backend``: cuda or cpu (auto:
    cuda where a worker offers GPU, else cpu); ``bus``: where the pool's events go."""

    def __init__(self, store: TensorStore, config: ForgeConfig, *, scheduler: str, backend: str | None = None,
                 bus: EventBus | None = None, poll_s: float = 0.5) -> None:
        from distributed import Client

        self.address = scheduler_address(scheduler)
        self.store = store
        self.config = config
        self.bus = bus or EventBus()
        self.poll_s = poll_s
        self._config_json = json.dumps(config.model_dump(mode="json"))
        self._log_level = logging.getLogger("distributed").level
        # the pool reports what matters as events; distributed's own log lines would land in the
        # middle of the CLI's output and on the app's screen
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        try:
            self.client = Client(self.address, timeout=config.pool.connect_timeout_s, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - refused, unresolvable, timed out: one line for the user
            logging.getLogger("distributed").setLevel(self._log_level)
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ForgeError(f"cannot reach the Dask scheduler at {self.address}: {why}") from None
        self._lock = threading.RLock()
        self._info: dict[str, dict[str, Any]] = {}
        """Address -> what ``worker.probe`` said (every worker seen alive)."""
        self._refused: dict[str, str] = {}
        self._eligible: set[str] = set()
        self._done_by: Counter[str] = Counter()
        self._evals: dict[int, _Eval] = {}
        self._ids = itertools.count()
        self._scattered: dict[str, Any] = {}
        self._pinned: dict[str, str] = {}
        self._lost: str | None = None
        self._last_status: Any = None
        self._no_worker_since: float | None = None
        self._stop = threading.Event()
        try:
            if not self.client.scheduler_info().get("workers"):
                try:  # a cluster just started: its workers are still joining
                    self.client.wait_for_workers(1, timeout=config.pool.connect_timeout_s)
                except Exception:  # noqa: BLE001 - no worker at all is said below, with what is missing
                    pass
            self.backend = self._resolve_backend(backend or config.evaluator.backend)
            self._refresh()
            if not self._eligible:
                raise ForgeError(self._no_worker_text())
        except BaseException:
            self._close_client()
            raise
        self._monitor = threading.Thread(target=self._watch, name="forge-cluster", daemon=True)
        self._monitor.start()

    # ---- the workers ------------------------------------------------------------------------------
    def _resolve_backend(self, name: str) -> str:
        if name != "auto":
            return name
        workers = self.client.scheduler_info().get("workers", {})
        return "cuda" if any((w.get("resources") or {}).get("GPU") for w in workers.values()) else "cpu"

    def _no_worker_text(self) -> str:
        res = remote.RESOURCE[self.backend]
        head = f"no worker of the Dask cluster at {self.address} can run {self.backend} evaluations"
        if not self._info:
            return f"{head}: it has no workers (start them with: dask worker {self.address} --resources {res}=1)"
        parts = []
        for addr, info in sorted(self._info.items()):
            if addr in self._refused:
                parts.append(f"{addr} on {info.get('host', '?')}: {self._refused[addr]}")
            elif not remote.serves(info, self.backend):
                parts.append(f"{addr} on {info.get('host', '?')} offers no {res} resource (--resources {res}=1)")
        return f"{head}: " + "; ".join(parts)

    def _refresh(self) -> None:
        """Probe the workers that joined, forget those that left (events for both)."""
        info = self.client.scheduler_info()
        alive = set(info.get("workers", {}))
        with self._lock:
            gone = [a for a in self._info if a not in alive]
            new = [a for a in alive if a not in self._info]
        if new:
            probed = self.client.run(remote.probe, workers=new, on_error="return")
            for addr in new:
                got = probed.get(addr)
                if isinstance(got, BaseException) or got is None:
                    w = info["workers"].get(addr, {})
                    got = {"address": addr, "host": w.get("host", ""), "resources": w.get("resources") or {},
                           "probe_error": f"{type(got).__name__}: {got}"}
                got["address"] = addr
                self._admit(addr, got)
        for addr in gone:
            with self._lock:
                old = self._info.pop(addr)
                self._eligible.discard(addr)
                self._refused.pop(addr, None)
            self._emit(WorkerChanged(seq=0, address=addr, host=old.get("host", ""),
                                     device=remote.device_of(old, self.backend), change="left"))

    def _admit(self, addr: str, info: dict[str, Any]) -> None:
        from .. import __version__

        why = (f"forge-tui cannot run there ({info['probe_error']})" if "probe_error" in info
               else remote.refusal(info, self.backend, self.config.evaluator.confinement, __version__))
        device = remote.device_of(info, self.backend) if "probe_error" not in info else ""
        with self._lock:
            self._info[addr] = info
            if not remote.serves(info, self.backend):
                return
            if why is not None:
                self._refused[addr] = why
            else:
                self._eligible.add(addr)
        self._emit(WorkerChanged(seq=0, address=addr, host=info.get("host", ""), device=device,
                                 change="refused" if why else "joined", reason=why or ""))

    def _device(self, addr: str) -> str:
        return remote.device_of(self._info.get(addr, {}), self.backend)

    def _workers_for(self, card: Card) -> tuple[str, ...] | None:
        with self._lock:
            return workers_for(card.id, {a: self._device(a) for a in self._eligible}, bool(self._refused), self._pinned)

    # ---- sending -------------------------------------------------------------------------------------
    def _inputs(self, card: Card) -> dict[str, Any]:
        """The card's captured tensors as Dask data by hash, scattered once to every usable worker."""
        keys = sorted({k for s in card.samples for k in (*s.inputs, *s.outputs)})
        with self._lock:
            missing = [k for k in keys if k not in self._scattered]
            if missing:
                data = {f"forge-tensor-{k}": self.store.path(k).read_bytes() for k in missing}
                futs = self.client.scatter(data, workers=sorted(self._eligible) or None, broadcast=True, hash=False)
                self._scattered.update({k: futs[f"forge-tensor-{k}"] for k in missing})
            return {k: self._scattered[k] for k in keys}

    def _send(self, rec: _Eval) -> None:
        restrict = self._workers_for(rec.card)
        inputs = self._inputs(rec.card)
        key = f"forge-eval-{rec.card.id[:48]}-{uuid.uuid4().hex[:12]}"
        opts = asdict(rec.options) if rec.options is not None else None
        dfut = self.client.submit(remote.evaluate, rec.card.model_dump(mode="json"), rec.source, opts, self._config_json,
                                  self.backend, self.config.evaluator.confinement, inputs, key=key, pure=False,
                                  resources={remote.RESOURCE[self.backend]: 1},
                                  workers=list(restrict) if restrict else None, allow_other_workers=False)
        with self._lock:
            rec.key, rec.dfut, rec.restricted, rec.worker = key, dfut, restrict, ""
        dfut.add_done_callback(lambda f, rec=rec, key=key: self._done(rec, key, f))

    def _done(self, rec: _Eval, key: str, dfut: Any) -> None:
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker

        with self._lock:
            if rec.key != key or rec.out.done():
                return  # superseded (resubmitted, or given up by the monitor)
        try:
            text = dfut.result()
        except KilledWorker:
            with self._lock:
                rec.deaths = max(rec.deaths, rec.base_deaths + self.config.pool.retries + 1)
            self._give_up(rec)
            return
        except FutureCancelledError as exc:
            # not by this pool (it forgets what it cancels first)
            if exc.reason == "scheduler-connection-lost" or self.client.status != "running":
                self._lose(f"the Dask scheduler at {self.address} went away")
            else:
                self._lost_inputs(rec, str(exc.reason))
            return
        except Exception as exc:  # noqa: BLE001 - the harness failed on the worker: the search records it
            self._fail(rec, exc)
            return
        result = EvalResult.from_json(text)
        addr = (getattr(result, "worker", None) or {}).get("address", "")
        with self._lock:
            self._evals.pop(id(rec), None)
            if addr:
                self._done_by[addr] += 1
        if not rec.out.done():
            rec.out.set_result(result)

    def _lost_inputs(self, rec: _Eval, why: str) -> None:
        """The scheduler dropped the evaluation: the worker that held the only copy of its tensors
        died under it (one worker left, or none). That counts as its worker's death; the tensors
        are sent again with the retry."""
        with self._lock:
            if rec.deaths <= rec.base_deaths:
                rec.died_on.append(f"{rec.worker or '?'} on {self._info.get(rec.worker, {}).get('host', '?')}")
                rec.deaths = rec.base_deaths + 1
            for s in rec.card.samples:
                for k in (*s.inputs, *s.outputs):
                    self._scattered.pop(k, None)
        if rec.deaths > self.config.pool.retries:
            self._give_up(rec)
            return
        with self._lock:
            rec.key, rec.worker, rec.base_deaths, rec.resend = "", "", rec.deaths, True

    def _fail(self, rec: _Eval, exc: BaseException) -> None:
        with self._lock:
            self._evals.pop(id(rec), None)
        if not rec.out.done():
            rec.out.set_exception(exc)

    def _give_up(self, rec: _Eval) -> None:
        """Its workers died too often: the node fails with the reason."""
        who = ", ".join(rec.died_on) or "its worker"
        reason = (f"the worker running it died {rec.deaths} times ({who}); after {self.config.pool.retries} "
                  "retries on other workers the evaluation was given up")
        with self._lock:
            self._evals.pop(id(rec), None)
            rec.key = ""
        if rec.dfut is not None:
            rec.dfut.cancel()
        if not rec.out.done():
            rec.out.set_result(EvalResult(status="error", failure="worker_lost", reason=reason, card=rec.card.id,
                                          backend=self.backend))

    def _lose(self, why: str) -> None:
        """The cluster is gone: every evaluation in flight fails with ``PoolLost``, and so will the next."""
        with self._lock:
            if self._lost is None:
                self._lost = f"{why}; every finished node is kept: forge search --resume continues"
            pending = list(self._evals.values())
            self._evals.clear()
        for rec in pending:
            if not rec.out.done():
                rec.out.set_exception(PoolLost(self._lost))

    # ---- the protocol ------------------------------------------------------------------------------
    def submit(self, card: Card, source: str, options: EvalOptions | None = None) -> "Future[EvalResult]":
        out: Future[EvalResult] = Future()
        rec = _Eval(card, source, options, out, time.monotonic())
        with self._lock:
            lost = self._lost
            if lost is None:
                self._evals[id(rec)] = rec
        if lost is not None:
            out.set_exception(PoolLost(lost))
            return out
        if not self._eligible:  # every usable worker is gone for now: sent once one is back
            rec.resend = True
            return out
        try:
            self._send(rec)
        except Exception as exc:  # noqa: BLE001 - a client that lost its scheduler mid-call, a tensor missing
            if self.client.status != "running":
                self._lose(f"the Dask scheduler at {self.address} went away")
            else:
                self._fail(rec, exc)
        return out

    def check(self, card: Card, source: str) -> "Future[EvalResult]":
        return self.submit(card, source, EvalOptions(timing=False))

    def profile(self, card: Card, source: str) -> "Future[EvalResult]":
        return self.submit(card, source, EvalOptions(profile=True))

    def build(self, source: str) -> "Future[BuildReport]":
        """Compiled on a worker of the backend (for its own arch), holding no resource."""
        out: Future[BuildReport] = Future()
        if self._lost is not None:
            out.set_exception(PoolLost(self._lost))
            return out
        with self._lock:
            where = sorted(self._eligible)
        dfut = self.client.submit(remote.build, source, self._config_json, self.backend, pure=False,
                                  workers=where or None, allow_other_workers=False)

        def done(f: Any) -> None:
            try:
                out.set_result(BuildReport.model_validate_json(f.result()))
            except Exception as exc:  # noqa: BLE001 - handed to the caller as the Future's exception
                out.set_exception(PoolLost(f"the Dask scheduler at {self.address} went away")
                                  if self.client.status != "running" else exc)

        dfut.add_done_callback(done)
        return out

    def close(self) -> None:
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=10)
        self._publish_status()  # the last evaluations' counts
        with self._lock:
            pending = list(self._evals.values())
            self._evals.clear()
        for rec in pending:
            if rec.dfut is not None:
                rec.dfut.cancel()
            if not rec.out.done():
                rec.out.cancel()
        if self._lost is None:
            try:  # the workers' judge processes end with the search; a worker that died since the
                # last poll is left out (a run addressed to it waits out the connect timeout)
                live = sorted(self._eligible & set(self.client.scheduler_info().get("workers", {})))
                if live:
                    self.client.run(remote.release, workers=live, on_error="ignore")
            except Exception:  # noqa: BLE001 - a worker gone meanwhile has no judge left to stop
                pass
        self._close_client()

    def _close_client(self) -> None:
        try:
            self.client.close(timeout=5)
        except Exception:  # noqa: BLE001 - a scheduler already gone: nothing left to close
            pass
        logging.getLogger("distributed").setLevel(self._log_level)

    # ---- the monitor -----------------------------------------------------------------------------
    def _emit(self, event: SearchEvent) -> None:
        self.bus.publish(event)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._lost is not None:
                return
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a scheduler that stopped answering
                if self.client.status != "running":
                    self._lose(f"the Dask scheduler at {self.address} went away ({type(exc).__name__})")
                    return

    def poll(self) -> None:
        """One look at the cluster: workers, evaluations in flight, retries, the status event."""
        if self.client.status != "running":
            self._lose(f"the Dask scheduler at {self.address} went away")
            return
        self._refresh()
        with self._lock:
            resend = [r for r in self._evals.values() if r.resend] if self._eligible else []
        for rec in resend:  # dropped with their tensors: the workers there are now get both
            self._send(rec)
            rec.resend = False
        with self._lock:
            recs = [r for r in self._evals.values() if r.key]
        states = self.client.run_on_scheduler(_by_value(_task_states), [r.key for r in recs]) if recs else {}
        for rec in recs:
            st = states.get(rec.key)
            if st is None:
                continue
            state, where, suspicious = st
            with self._lock:
                deaths = rec.base_deaths + suspicious
                if deaths > rec.deaths:
                    rec.died_on.append(f"{rec.worker or '?'} on {self._info.get(rec.worker, {}).get('host', '?')}")
                    rec.deaths = deaths
                rec.worker = where
            if rec.deaths > self.config.pool.retries:
                self._give_up(rec)
            elif rec.restricted and (state == "no-worker" or not set(rec.restricted) & self._eligible):
                self._resubmit(rec)
        self._watch_eligible()
        self._publish_status()

    def _resubmit(self, rec: _Eval) -> None:
        """Its workers are gone (the restriction names none alive): send it again to those there are."""
        if not self._eligible:
            return
        with self._lock:
            old, rec.base_deaths = rec.dfut, rec.deaths
        self._send(rec)
        if old is not None:
            old.cancel()

    def _watch_eligible(self) -> None:
        if self._eligible:
            self._no_worker_since = None
            return
        now = time.monotonic()
        if self._no_worker_since is None:
            self._no_worker_since = now
        elif now - self._no_worker_since >= self.config.pool.no_worker_s:
            self._lose(self._no_worker_text() + f" any more (none for {self.config.pool.no_worker_s:.0f} s)")

    def status(self) -> ClusterStatus:
        now = time.monotonic()
        with self._lock:
            busy = {r.worker for r in self._evals.values() if r.worker}
            workers = []
            for addr, info in sorted(self._info.items()):
                state = ("refused" if addr in self._refused else "busy" if addr in busy else
                         "idle" if addr in self._eligible else "other")
                workers.append(WorkerView(address=addr, host=info.get("host", ""), device=self._device(addr),
                                          state=state, reason=self._refused.get(addr, ""), done=self._done_by[addr]))
            flight = [EvalInFlight(card=r.card.id, worker=r.worker, host=self._info.get(r.worker, {}).get("host", ""),
                                   attempt=r.deaths + 1, seconds=round(now - r.submitted, 1))
                      for r in sorted(self._evals.values(), key=lambda r: r.submitted)]
            return ClusterStatus(seq=0, scheduler=self.address, backend=self.backend, workers=workers,
                                 in_flight=flight, pinned=dict(self._pinned))

    def _publish_status(self) -> None:
        st = self.status()
        same = st.model_copy(update={"in_flight": [e.model_copy(update={"seconds": 0.0}) for e in st.in_flight]})
        if same != self._last_status:
            self._last_status = same
            self._emit(st)

    def received(self) -> dict[str, dict[str, int]]:
        """Per worker, the tensors it received and verified, by hash (each should be 1)."""
        got: dict[str, dict[str, int]] = self.client.run(remote.counts)
        return got
