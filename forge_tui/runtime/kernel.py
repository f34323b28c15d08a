"""One promoted kernel loaded into this process, called with the least work per call.

The guard has already checked that a call's tensors have the card's shapes, strides and dtypes,
so the descriptors are built once; a call only writes the data pointers, allocates the outputs
(and the workspace, from PyTorch's stream-ordered allocator) and launches on the current stream.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..kernel_abi import DTYPE_CODES, ForgeScalar, ForgeTensor, Library, alloc_outputs, card_scalars, current_arch, workspace_for
from .manifest import Build, Entry, sha256_file

if TYPE_CHECKING:
    import torch

    from ..cards import TensorSpec


class KernelUnavailable(Exception):
    """This machine cannot run the kernel (no build for its arch, a checksum that does not match)."""


class KernelError(Exception):
    """The kernel failed on a call (a non-zero return: a launch error, arguments it refuses)."""


def pick_build(entry: Entry, backend: str) -> Build:
    arch = current_arch(backend)
    for b in entry.builds:
        if b.backend == backend and b.arch == arch:
            return b
    have = ", ".join(f"{b.backend}/{b.arch}" for b in entry.builds) or "none"
    raise KernelUnavailable(f"no build for {backend}/{arch} (built for {have})")


def _descriptor(spec: "TensorSpec") -> ForgeTensor:
    d = ForgeTensor()
    d.data = 0
    d.dtype = DTYPE_CODES[spec.dtype]
    d.ndim = len(spec.shape)
    for k, (n, st) in enumerate(zip(spec.shape, spec.stride)):
        d.shape[k] = n
        d.stride[k] = st
    return d


class CardKernel:
    def __init__(self, entry: Entry, folder: Path, device: str) -> None:
        backend = "cuda" if device == "cuda" else "cpu"
        build = pick_build(entry, backend)
        path = Path(folder) / build.path
        if not path.is_file():
            raise KernelUnavailable(f"its build {build.path} is missing")
        if sha256_file(path) != build.sha256:
            raise KernelUnavailable(f"its build {build.path} does not match the manifest's checksum")
        try:
            self.lib = Library(path)
        except (OSError, LookupError) as exc:
            raise KernelUnavailable(f"its build does not load: {exc}") from None
        sig = entry.signature
        self.device = device
        self.out_specs = sig.outputs
        scalars = card_scalars(sig.program)
        self._ins: Any = (ForgeTensor * max(len(sig.inputs), 1))(*[_descriptor(s) for s in sig.inputs])
        self._outs: Any = (ForgeTensor * max(len(sig.outputs), 1))(*[_descriptor(s) for s in sig.outputs])
        self._scs: Any = (ForgeScalar * max(len(scalars), 1))(*[s.to_c() for s in scalars])
        self._n = (len(sig.inputs), len(sig.outputs), len(scalars))
        self._scalars = scalars
        self._lock = threading.Lock()
        self.last_host_ns = 0
        """Host time of the last call spent on anything but the launch (outputs, descriptors)."""

    def __call__(self, inputs: list["torch.Tensor"]) -> list["torch.Tensor"]:
        import torch

        t0 = time.perf_counter_ns()
        outs = alloc_outputs(self.out_specs, self.device)
        stream = torch.cuda.current_stream().cuda_stream if self.device == "cuda" else None
        n_in, n_out, n_sc = self._n
        with self._lock:
            for i, t in enumerate(inputs):
                self._ins[i].data = t.data_ptr()
            for i, t in enumerate(outs):
                self._outs[i].data = t.data_ptr()
            ws = None
            if self.lib.needs_workspace:
                try:
                    ws = workspace_for(self.lib, inputs, outs, self._scalars, self.device)
                except ValueError as exc:
                    raise KernelError(str(exc)) from None
            t1 = time.perf_counter_ns()
            rc = self.lib.call_raw(self._ins, n_in, self._outs, n_out, self._scs, n_sc, stream, ws)
            self.last_host_ns = t1 - t0
        if rc != 0:
            raise KernelError(f"forge_launch returned {rc}")
        return outs
