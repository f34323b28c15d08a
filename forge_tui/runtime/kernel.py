"""One promoted kernel loaded into this process, called with the least work per call.

The guard has already checked that a call's tensors have the card's shapes, strides and dtypes,
so the descriptors are built once; a call only writes the data pointers, allocates the outputs
(from PyTorch's stream-ordered allocator; a kernel's workspace is kept per stream) and launches
on the current stream.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..kernel_abi import DTYPE_CODES, ForgeScalar, ForgeTensor, Library, alloc_outputs, alloc_workspace, card_scalars, current_arch
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


def _describe(descs: Any, tensors: list["torch.Tensor"]) -> None:
    """Each descriptor's shape and strides those of its tensor (a range card's call)."""
    for d, t in zip(descs, tensors):
        d.ndim = t.dim()
        for k, (n, st) in enumerate(zip(t.shape, t.stride())):
            d.shape[k] = n
            d.stride[k] = st


class CardKernel:
    _ranges: Any = None
    """A range card's ranged dimensions (set per kernel in ``__init__``; None: an exact card's)."""

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
        self._ws_bytes: int | None = None
        """The workspace the kernel asks for, asked once: the guard fixes every shape, stride and
        scalar it depends on, and forge_workspace_bytes may not read the data pointers."""
        import torch

        self._empty = [_allocator(s, sig.inputs) for s in self.out_specs]
        """How each output is allocated: like the input it matches where there is one (the
        cheapest call), else torch.empty where the card's strides are contiguous, else
        empty_strided."""
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw if device == "cuda" else None
        """The current stream's handle without building a Stream object (what inductor calls)."""
        self._empty_like = torch.empty_like
        self._empty_plain = torch.empty
        self._torch = torch
        self._dead: dict[tuple[int, Any, int | None], torch.Tensor] = {}
        """The outputs callers drop, kept (``_dead_output``)."""
        self._scratch: dict[tuple[Any, int | None], torch.Tensor] = {}
        """The workspace, one per device and stream, kept (``_workspace``)."""
        self._capturing = torch.cuda.is_current_stream_capturing if device == "cuda" else None
        self._launch = self.lib.plain_launch
        """forge_launch itself, None for a kernel with a workspace (``Library.plain_launch``)."""
        self.last_host_ns = 0
        """Host time of the last timed call spent on anything but the launch (outputs, descriptors)."""
        self._ranges = sig.ranges
        """A range card's ranged dimensions: a call's descriptors take its tensors' own shapes and
        strides, its outputs are sized from its inputs (``ranges.output_shape``) and the workspace
        is asked per shape (``_ws_by_shape``)."""
        self._ws_by_shape: dict[tuple[Any, ...], int] = {}

    def _ranged_outputs(self, inputs: list["torch.Tensor"]) -> list["torch.Tensor"]:
        """A range card's fresh outputs for a call at any size of its range: each ranged dimension
        the size of the input dimension it follows, laid out as the card's output is."""
        from ..ranges import output_layout

        device = inputs[0].device if inputs else self.device
        outs = []
        for k, spec in enumerate(self.out_specs):
            layout = output_layout(spec.shape, spec.stride, k, self._ranges, inputs)
            if layout is None:
                raise KernelError(f"output {k}'s size follows no input's")
            shape, stride = layout
            dtype = getattr(self._torch, spec.dtype)
            outs.append(self._torch.empty_strided(shape, stride, dtype=dtype, device=device) if stride is not None
                        else self._torch.empty(shape, dtype=dtype, device=device))
        return outs

    def _outputs(self, inputs: list["torch.Tensor"], keep: int = -1, stream: int | None = None) -> list["torch.Tensor"]:
        """Fresh outputs; with ``keep`` >= 0, fresh only that one and the others from ``_dead``."""
        if self._ranges:
            return self._ranged_outputs(inputs)
        device = inputs[0].device if inputs else self.device
        outs = []
        for k, (like, make, args, dtype) in enumerate(self._empty):
            if keep >= 0 and k != keep:
                outs.append(self._dead_output(k, device, stream))
            elif like >= 0:
                outs.append(self._empty_like(inputs[like]))
            else:
                try:
                    outs.append(make(*args, dtype=dtype, device=device))
                except RuntimeError:  # strides PyTorch cannot make: the card's shape, contiguous
                    outs.append(self._empty_plain(*self.out_specs[k].shape, dtype=dtype, device=device))
        return outs

    def _dead_output(self, k: int, device: Any, stream: int | None) -> "torch.Tensor":
        """Output ``k`` for a caller that drops it (a leaf module returning another of the op's
        outputs: the mean and rstd of a layer norm): one buffer per output, device and stream,
        kept, so the call allocates only what it returns. Kernels on one stream run in order, so
        a kernel that reads back what it wrote there still sees its own values."""
        key = (k, device, stream)
        t = self._dead.get(key)
        if t is None:
            import torch

            (t,) = alloc_outputs([self.out_specs[k]], device)
            if self.device == "cuda" and torch.cuda.is_current_stream_capturing():
                return t  # memory of a graph's pool: not kept past this call
            self._dead[key] = t
        return t

    def _workspace(self, device: Any, stream: int | None) -> "torch.Tensor":
        """The kernel's scratch for a call on ``stream``: one buffer per device and stream, kept
        from call to call (an allocation and an aligned view cost the host more than the launch).
        The ABI leaves its contents undefined on entry and the evaluator poisons it before every
        call, so no promoted kernel reads what an earlier call left; kernels on one stream run in
        order, so one call's scratch is never another's while it runs. A call captured in a CUDA
        graph gets a fresh one from the graph's pool, neither kept nor shared with eager calls."""
        if self._capturing is not None and self._capturing():
            return alloc_workspace(self._ws_bytes or 0, str(device))
        key = (device, stream)
        ws = self._scratch.get(key)
        if ws is None:
            ws = self._scratch[key] = alloc_workspace(self._ws_bytes or 0, str(device))
        return ws

    def _workspace_size(self, inputs: list["torch.Tensor"], outs: list["torch.Tensor"]) -> int:
        """The workspace's size, asked of the kernel on the first call (see ``_ws_bytes``)."""
        if self._ws_bytes is None:
            try:
                self._ws_bytes = self.lib.workspace_bytes(inputs, outs, self._scalars)
            except ValueError as exc:
                raise KernelError(str(exc)) from None
        return self._ws_bytes

    def __call__(self, inputs: list["torch.Tensor"], timed: bool = False, keep: int = -1) -> list["torch.Tensor"]:
        """The kernel's outputs for inputs the guard has matched. ``timed``: record in
        ``last_host_ns`` the host time spent before the launch. ``keep`` >= 0: the caller uses
        only that output (see ``_dead_output``)."""
        t0 = time.perf_counter_ns() if timed else 0
        stream = None
        if self._raw_stream is not None:
            index = inputs[0].get_device() if inputs else -1
            stream = int(self._raw_stream(index)) if index >= 0 else self._stream(inputs)
        outs = self._outputs(inputs, keep, stream)
        n_in, n_out, n_sc = self._n
        with self._lock:
            ins_d, outs_d = self._ins, self._outs
            for i, t in enumerate(inputs):
                ins_d[i].data = t.data_ptr()
            for i, t in enumerate(outs):
                outs_d[i].data = t.data_ptr()
            if self._ranges:
                _describe(ins_d, inputs)
                _describe(outs_d, outs)
            ws = None
            if self._launch is None:
                if self._ranges:  # the workspace a kernel asks for depends on the call's shapes
                    key = tuple(tuple(t.shape) for t in inputs)
                    size = self._ws_by_shape.get(key)
                    if size is None:
                        self._ws_bytes = None
                        size = self._ws_by_shape[key] = self._workspace_size(inputs, outs)
                    self._ws_bytes = size
                    self._scratch = {k: v for k, v in self._scratch.items() if v.numel() >= size}
                else:
                    self._workspace_size(inputs, outs)
                ws = self._workspace(outs[0].device if outs else self.device, stream)
            if timed:
                self.last_host_ns = time.perf_counter_ns() - t0
            if ws is not None:
                rc = self.lib.call_raw(ins_d, n_in, outs_d, n_out, self._scs, n_sc, stream, ws)
            else:
                rc = self._launch(ins_d, n_in, outs_d, n_out, self._scs, n_sc, stream)
        if rc != 0:
            raise KernelError(f"forge_launch returned {rc}")
        return outs

    def bind(self, keep: int) -> "Callable[[list[torch.Tensor], int], torch.Tensor] | None":
        """None for a range card's kernel, whose descriptors change with every call's shapes."""
        return None if self._ranges else self._bind(keep)

    def _bind(self, keep: int) -> "Callable[[list[torch.Tensor], int], torch.Tensor] | None":
        """``__call__`` for a caller that uses output ``keep`` alone, specialised (a leaf module's
        learned site, ``leaf.LeafSites._fast``; a module card, ``specialised.specialised``): the
        launch called without ctypes' argument conversion on pointers converted once, the
        descriptors' entries looked up once, the outputs the caller drops and the workspace taken
        per device and stream from ``_dead`` and ``_scratch`` once. Returns that output. None for
        a library that exports neither launch."""
        import ctypes

        with_ws = self._launch is None
        fn = self.lib.ws_launch if with_ws else self._launch
        if fn is None:
            return None
        n_in, n_out, n_sc = self._n
        address = ctypes.cast(fn, ctypes.c_void_p).value
        params = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32]
        if with_ws:
            params += [ctypes.c_void_p, ctypes.c_int64]
        raw_fn: Any = ctypes.CFUNCTYPE(ctypes.c_int, *params, ctypes.c_void_p)(address or 0)
        raw_fn.argtypes = None  # every argument below is already a ctypes value: no per-call conversion
        ptr_in, ptr_out, ptr_sc = (ctypes.c_void_p(ctypes.addressof(a)) for a in (self._ins, self._outs, self._scs))
        c_in, c_out, c_sc = ctypes.c_int32(n_in), ctypes.c_int32(n_out), ctypes.c_int32(n_sc)
        in_descs = [self._ins[i] for i in range(n_in)]
        kept = self._outs[keep]
        like, make, args, dtype = self._empty[keep]
        empty_like, empty_plain, shape = self._empty_like, self._empty_plain, self.out_specs[keep].shape
        raw_stream, lock, dead_output, kept_dead = self._raw_stream, self._lock, self._dead_output, self._dead
        streams: dict[tuple[int, int | None], tuple[Any, list[tuple[Any, int]], tuple[Any, ...], list[Any]]] = {}
        """Per device index and stream: its handle as a ctypes value, the dropped outputs'
        (descriptor, pointer), the workspace's pointer and size as ctypes values (none without
        one), and the tensors behind those pointers."""
        dead_ks = [k for k in range(n_out) if k != keep]

        def per_stream(index: int, device: Any, stream: int | None, inputs: list[Any], out: Any) -> tuple[Any, ...]:
            dead = [(self._outs[k], dead_output(k, device, stream)) for k in dead_ks]
            held = [t for _, t in dead]
            reuse = all(kept_dead.get((k, device, stream)) is t for k, t in zip(dead_ks, held))
            extra: tuple[Any, ...] = ()
            if with_ws:
                outs = [out] * n_out
                for k, t in zip(dead_ks, held):
                    outs[k] = t
                self._workspace_size(inputs, outs)
                ws = self._workspace(device, stream)
                held.append(ws)
                extra = (ctypes.c_void_p(ws.data_ptr()), ctypes.c_int64(ws.numel()))
                reuse = reuse and self._scratch.get((device, stream)) is ws
            entry = (ctypes.c_void_p(stream), [(d, t.data_ptr()) for d, t in dead], extra, held)
            if reuse:
                streams[(index, stream)] = entry  # kept in ``_dead`` and ``_scratch`` (not a graph capture's)
            return entry  # ``held`` keeps a graph capture's buffers alive until the launch

        clock = time.perf_counter_ns

        def call(inputs: list["torch.Tensor"], t0: int = 0) -> "torch.Tensor":
            """``t0``: a perf_counter_ns the caller started from; the host time from it to the
            launch is then kept in ``last_host_ns``."""
            stream = None
            index = -1
            if raw_stream is not None:
                index = inputs[0].get_device()
                stream = int(raw_stream(index)) if index >= 0 else self._stream(inputs)
            if like >= 0:
                out = empty_like(inputs[like])
            else:
                device = inputs[0].device if inputs else self.device
                try:
                    out = make(*args, dtype=dtype, device=device)
                except RuntimeError:
                    out = empty_plain(*shape, dtype=dtype, device=device)
            with lock:
                got = streams.get((index, stream))
                if got is None:
                    got = per_stream(index, inputs[0].device if inputs else self.device, stream, inputs, out)
                c_stream, dead, extra, _held = got
                for d, t in zip(in_descs, inputs):
                    d.data = t.data_ptr()
                kept.data = out.data_ptr()
                for d, ptr in dead:
                    d.data = ptr
                if t0:
                    self.last_host_ns = clock() - t0
                if with_ws:
                    rc = raw_fn(ptr_in, c_in, ptr_out, c_out, ptr_sc, c_sc, extra[0], extra[1], c_stream)
                else:
                    rc = raw_fn(ptr_in, c_in, ptr_out, c_out, ptr_sc, c_sc, c_stream)
            if rc != 0:
                raise KernelError(f"forge_launch returned {rc}")
            return out

        return call

    def _stream(self, inputs: list["torch.Tensor"]) -> int | None:
        if self.device != "cuda":
            return None
        import torch

        return int(torch.cuda.current_stream().cuda_stream)


def contiguous_strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


def _dense(shape: list[int], stride: list[int]) -> bool:
    """Whether a layout covers its storage exactly once (what empty_like keeps)."""
    acc = 1
    for n, st in sorted(zip(shape, stride), key=lambda d: d[1]):
        if n == 1:
            continue
        if st != acc:
            return False
        acc *= n
    return True


def _allocator(out: "TensorSpec", inputs: list["TensorSpec"]) -> tuple[int, Any, tuple[Any, ...], Any]:
    """(the input whose empty_like gives this output, or -1; else the factory, its size arguments,
    the dtype). The guard has matched every input's dtype, shape and strides to the card's, and
    empty_like keeps the strides of a dense input."""
    import torch

    for k, sp in enumerate(inputs):
        if (sp.dtype, list(sp.shape), list(sp.stride)) == (out.dtype, list(out.shape), list(out.stride)) and \
                _dense(list(sp.shape), list(sp.stride)):
            return k, None, (), None
    dtype = getattr(torch, out.dtype)
    if list(out.stride) == contiguous_strides(list(out.shape)):
        # the sizes as separate arguments: parsed faster than one tuple
        return -1, torch.empty, tuple(out.shape) if out.shape else ((),), dtype
    return -1, torch.empty_strided, (tuple(out.shape), tuple(out.stride)), dtype
