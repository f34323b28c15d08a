"""What runs inside a Dask worker process for ``DaskEvalPool``.

The client sends a candidate's source, its card, the evaluation's options and the search's
configuration, and the card's captured tensors as Dask data (one datum per content hash, so a
worker receives each tensor once and keeps it). On arrival a tensor is checked against its hash
and written to the worker's own tensor store; the worker then runs the same ``Evaluator`` as the
local pool (it builds the source for this worker's own GPU, cached by hash; a judge process holds
the references and clocks; the candidate runs in its confined runner) and returns the typed result
as JSON, stamped with the worker that ran it (``stamp``).

One evaluation at a time per worker process (a lock, besides the scheduler's ``GPU=1`` / ``CPU=1``
resource), and a worker refuses candidates when it cannot judge them properly (``refusal``): a GPU
worker that sees several GPUs or none, a machine without the confinement the configuration asks for.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

RESOURCE = {"cuda": "GPU", "cpu": "CPU"}
"""The Dask worker resource an evaluation of each backend holds (``dask worker --resources GPU=1``,
dask-cuda's convention; ``CPU=1`` for a worker that runs cpu-backend evaluations)."""

_lock = threading.Lock()
_state: dict[str, Any] = {"evaluator": None, "config": None, "arrived": {}, "info": None}
received: Counter[str] = Counter()
"""Times each tensor (by hash) reached this worker process: a datum Dask keeps in the worker's
memory reaches every later evaluation as the same object, one sent again is a new one."""


def forge_dir() -> Path:
    """The worker's own folder: its tensor store and its build cache (shared by the workers of a
    host: builds and tensors are written atomically, keyed by hash)."""
    from ..roofline import cache_dir

    return cache_dir() / "cluster"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _confinement() -> str | None:
    """Why this machine cannot confine a candidate (None: it can): the judge builds the same filter."""
    from ..evaluator import confine

    try:
        confine.seccomp_filter(os.getpid())
    except confine.ConfinementUnavailable as exc:
        return str(exc)
    return None


def _dask_worker() -> Any:
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def probe(dask_worker: Any = None) -> dict[str, Any]:
    """What this worker process is: its host, address, resources, the GPUs it sees (their name and
    arch), its CPU, whether it can confine candidates, and the forge-tui it runs. ``dask_worker``:
    the worker (``Client.run`` passes it; inside a task it is found)."""
    from .. import __version__

    w = dask_worker if dask_worker is not None else _dask_worker()
    resources = dict(getattr(getattr(w, "state", None), "total_resources", {}) or {}) if w is not None else {}
    info: dict[str, Any] = {"address": getattr(w, "address", ""), "host": socket.gethostname(), "pid": os.getpid(),
                            "resources": resources, "cpu": _cpu_name(), "cpus": len(os.sched_getaffinity(0)),
                            "gpus": 0, "gpu": "", "arch": "", "version": __version__,
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "confinement": _confinement()}
    if resources.get("GPU"):
        try:
            import torch

            info["gpus"] = torch.cuda.device_count()
            if info["gpus"]:
                major, minor = torch.cuda.get_device_capability(0)
                info["gpu"], info["arch"] = torch.cuda.get_device_name(0), f"sm_{major}{minor}"
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason to refuse, not a crash
            info["gpu_error"] = f"{type(exc).__name__}: {exc}"
    return info


def own_gpu() -> str | None:
    """This worker's GPU: the first of CUDA_VISIBLE_DEVICES (dask-cuda's convention: each worker
    lists every GPU, its own first), or None where it is not set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return visible.split(",")[0].strip() or None if visible else None


def device_of(info: dict[str, Any], backend: str) -> str:
    """The device a worker times on: the GPU's name and arch, or the CPU's model."""
    if backend == "cuda":
        return f"{info.get('gpu') or '?'} ({info.get('arch') or '?'})"
    return str(info.get("cpu") or "cpu")


def refusal(info: dict[str, Any], backend: str, confinement: str, version: str | None = None) -> str | None:
    """Why this worker must not run the backend's evaluations (None: it may). A worker without the
    backend's resource is no such worker at all (``serves``); this is for those that are."""
    if version is not None and info.get("version") != version:
        return f"it runs forge-tui {info.get('version')}, the search runs {version}"
    if backend == "cuda":
        if info.get("gpu_error"):
            return f"its GPUs cannot be read: {info['gpu_error']}"
        if info.get("gpus", 0) == 0:
            return "it offers GPU=1 but sees no CUDA GPU"
        if info["gpus"] > 1 and not info.get("cuda_visible_devices"):
            return (f"it sees {info['gpus']} GPUs and CUDA_VISIBLE_DEVICES does not say which is its own: one "
                    "evaluation at a time per GPU needs one worker per GPU (dask cuda worker, or "
                    "CUDA_VISIBLE_DEVICES=i dask worker ... --resources GPU=1 for each GPU i)")
    if confinement == "required" and info.get("confinement"):
        return (f"it cannot confine candidates: {info['confinement']} (install libseccomp2 there, or set "
                '[evaluator] confinement = "off")')
    return None


def serves(info: dict[str, Any], backend: str) -> bool:
    """Whether the worker offers the backend's resource."""
    return bool((info.get("resources") or {}).get(RESOURCE[backend]))


def _info() -> dict[str, Any]:
    if _state["info"] is None:
        _state["info"] = probe()
    info: dict[str, Any] = _state["info"]
    return info


def stamp(info: dict[str, Any], backend: str) -> dict[str, Any]:
    """What a result records of the worker that ran it."""
    return {"address": info.get("address", ""), "host": info.get("host", ""), "pid": info.get("pid"),
            "device": device_of(info, backend), "gpu": info.get("gpu", ""), "arch": info.get("arch", ""),
            "cuda_visible_devices": info.get("cuda_visible_devices")}


def install(store: Any, key: str, raw: bytes) -> str | None:
    """Check a tensor that arrived against its hash and put it in the worker's store; None when it
    is good, else what is wrong (the evaluation is refused: its inputs are not the card's)."""
    if _state["arrived"].get(key) is raw:
        return None  # checked when it arrived: the same bytes, kept in this worker's memory
    import torch

    from ..tensorstore import _digest

    try:
        d = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        packed = (d["flat"], tuple(d["shape"]), tuple(d["stride"]), d["mode"])
    except Exception as exc:  # noqa: BLE001 - damaged bytes are a refusal with the reason
        return f"tensor {key[:12]} arrived unreadable: {type(exc).__name__}: {exc}"
    got = _digest(*packed)
    if got != key:
        return f"tensor {key[:12]} arrived with hash {got[:12]}: its bytes changed on the way"
    if store.put_packed(packed) != key:  # pragma: no cover - the store hashes as _digest does
        return f"tensor {key[:12]} was stored under another hash"
    _state["arrived"][key] = raw
    received[key] += 1
    return None


def _evaluator(config_json: str, backend: str) -> Any:
    """This process's evaluator for the search's configuration (a new one when it changes)."""
    from ..config import parse_config
    from ..evaluator import Evaluator
    from ..tensorstore import TensorStore

    key = hashlib.sha256(f"{backend}|{config_json}".encode()).hexdigest()
    if _state["config"] != key:
        if _state["evaluator"] is not None:
            _state["evaluator"].close()
            _state["evaluator"] = None
        root = forge_dir()
        cfg = parse_config(json.loads(config_json), "the search's configuration")
        gpu = own_gpu() if backend == "cuda" else None
        # the judge, and the candidate's runner under it, see this worker's GPU alone
        _state["evaluator"] = Evaluator(TensorStore(root / "tensors"), root / "builds", cfg, backend=backend,
                                        worker_env={"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else None)
        _state["config"] = key
    return _state["evaluator"]


def _error(card: dict[str, Any], backend: str, failure: str, reason: str, info: dict[str, Any]) -> str:
    from ..evaluator.result import EvalResult

    r = EvalResult(status="error", failure=failure, reason=reason, card=str(card.get("id", "")), backend=backend)
    return _stamped(r, info, backend)


def _stamped(result: Any, info: dict[str, Any], backend: str) -> str:
    data = result.to_dict()
    data["worker"] = stamp(info, backend)
    return json.dumps(data)


def evaluate(card: dict[str, Any], source: str, options: dict[str, Any] | None, config_json: str, backend: str,
             confinement: str, inputs: dict[str, bytes]) -> str:
    """One evaluation on this worker: the ``EvalResult`` as JSON, with ``worker`` (``stamp``)."""
    from ..cards import Card
    from ..evaluator import EvalOptions

    info = _info()
    why = refusal(info, backend, confinement)
    if why is not None:
        return _error(card, backend, "worker_refused", f"worker {info['address']} on {info['host']} refuses "
                                                       f"candidates: {why}", info)
    with _lock:
        t0 = time.perf_counter()
        ev = _evaluator(config_json, backend)
        for key, raw in inputs.items():
            bad = install(ev.store, key, raw)
            if bad is not None:
                return _error(card, backend, "inputs", f"worker {info['address']} on {info['host']}: {bad}", info)
        staged = time.perf_counter() - t0
        result = ev.evaluate(Card.model_validate(card), source, EvalOptions(**options) if options else None)
    result.phase_seconds.setdefault("inputs", staged)
    return _stamped(result, info, backend)


def build(source: str, config_json: str, backend: str) -> str:
    """Compile only, on this worker (for its own arch): the ``BuildReport`` as JSON."""
    from ..evaluator.result import BuildReport

    with _lock:
        ev = _evaluator(config_json, backend)
    return BuildReport.model_validate(ev.builder.build(source).to_json()).model_dump_json()


def counts() -> dict[str, int]:
    """``received`` (for tests and the bench: each tensor should arrive once per worker)."""
    return dict(received)


def release() -> None:
    """Stop this process's judge (``DaskEvalPool.close``); the next evaluation starts a fresh one."""
    with _lock:
        if _state["evaluator"] is not None:
            _state["evaluator"].close()
        _state["evaluator"], _state["config"] = None, None
