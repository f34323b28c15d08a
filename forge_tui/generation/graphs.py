"""Capturing a decode step in a CUDA graph, and telling why a step cannot be.

A decode step is captured once per batch-size bucket (``runner.GreedyRunner``) and then replayed:
a replay launches the recorded kernels alone, so a step costs the host one launch instead of the
Python, dispatch and forge's guards of every op. What a CUDA graph cannot hold is a step that
reads the device back on the host (``.item()``, ``.tolist()``, a ``nonzero`` whose size the host
needs) or copies between host and device: ``host_syncs`` runs one step under a dispatch mode that
names the first such op and the line of the model that made it, on any device (the CPU included,
where nothing is captured), so the reason is given before any capture is tried.

``CudaCapture`` is the capture itself (``torch.cuda.CUDAGraph`` into one private memory pool for
every bucket); tests pass a stand-in with the same ``capture`` method.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING_OPS = {
    "_local_scalar_dense": "reads a value back to the host (.item(), .tolist(), bool())",
    "nonzero": "makes a tensor whose size the host must read back (nonzero)",
    "masked_select": "makes a tensor whose size the host must read back (masked_select)",
    "_unique2": "makes a tensor whose size the host must read back (unique)",
    "unique_dim": "makes a tensor whose size the host must read back (unique)",
    "unique_consecutive": "makes a tensor whose size the host must read back (unique_consecutive)",
    "equal": "compares tensors on the host (torch.equal)",
    "is_nonzero": "reads a value back to the host (is_nonzero)",
}
"""aten ops (by their overload packet's name) whose result the host waits for."""

_TORCH_DIR = str(Path(torch.__file__).parent)
_THIS_DIR = str(Path(__file__).parent)


def _model_line() -> str:
    """The innermost frame outside torch and this package: the model's line that made the op."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH_DIR, _THIS_DIR)) and "/torch/" not in name:
            return f"{frame.f_code.co_qualname} ({Path(name).name}:{frame.f_lineno})"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


class _SyncScan(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.found is None:
            name = func.overloadpacket.__name__
            why = SYNCING_OPS.get(name)
            if why is None and name in ("_to_copy", "copy_"):
                devices = {t.device.type for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
                target = kwargs.get("device")
                if target is not None:
                    devices.add(torch.device(target).type)
                if "cpu" in devices and len(devices) > 1:
                    why = "copies between host and device"
            if why is not None:
                self.found = f"aten.{name} in {_model_line()} {why}"
        return func(*args, **kwargs)


def host_syncs(step: Callable[[], Any]) -> str | None:
    """Run ``step`` once and say where it makes the host wait for the device (the first op that
    does, and the model's line that called it), or None where nothing in it does."""
    scan = _SyncScan()
    with scan:
        step()
    return scan.found


class Capture(Protocol):
    """Captures a callable once; returns the replay (which repeats its device work)."""

    def capture(self, fn: Callable[[], Any], warmup: int) -> Callable[[], None]: ...


def _end_failed_capture() -> None:
    """Take the CUDA generator out of capture after a capture that failed (PyTorch ends that
    state only when a capture ends well; every later random op would raise otherwise): one
    capture that succeeds, on a side stream."""
    try:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            buf = torch.zeros(1, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                buf.add_(1)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the caller reports the capture's own failure
        pass


class CudaCapture:
    """``torch.cuda.CUDAGraph`` capture, every graph in one private memory pool (the buckets'
    steps never run at once, and each copies what it keeps into buffers of its own)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any], warmup: int) -> Callable[[], None]:
        caller = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(caller)
        try:
            with torch.cuda.stream(side):
                for _ in range(warmup):  # first calls (lazy set-up, compiles) stay out of the graph
                    fn()
            caller.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                fn()
            torch.cuda.synchronize()
        except Exception:
            torch.cuda.set_stream(caller)
            _end_failed_capture()
            raise
        finally:
            torch.cuda.set_stream(caller)
        return graph.replay
