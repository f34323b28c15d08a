"""What follows a folded convolution, in one pass: its bias, then a residual if any, then the ReLU.

PyTorch adds a convolution's bias in an elementwise kernel of its own after cuDNN's, a large part
of a folded ResNet's GPU time, then passes over the same tensors again for the residual adds and
the ReLUs. Where the
traced forward applies a ReLU to the folded output (``relu(bn(conv(x)))``) or to its sum with
another tensor (``relu(bn(conv(x)) + z)``), the fold computes the convolution without its bias
and this module finishes the output in place: one read and one write of it. Values are added in
float32 and rounded once.

Three ways to run it, the first this machine has:
- the native kernel (``epilogue.cu``), built once per machine and GPU arch with nvcc into the
  cache (``FORGE_CACHE_DIR``), called through ctypes: a few microseconds of host a call, so it
  pays op by op as well as in CUDA graphs;
- a Triton kernel, CUDA graphs only (``Mode.CUDA_GRAPH``): its launch from Python costs the host
  more than the ops it replaces, so op by op a folded ResNet runs slower with it than with plain
  folds, where in graphs it takes a third of the GPU time off the forward;
- PyTorch's in-place ops, each a pass of its own (any device, any layout).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

_KERNEL: Any = None
_TRITON: bool | None = None

SOURCE = Path(__file__).resolve().parent / "epilogue.cu"
BUILD_TIMEOUT_S = 180.0
_NATIVE: Any = None
"""The native kernel's C entry point once loaded; False where it cannot be had (``native_why``)."""
_NATIVE_WHY = ""
_NATIVE_LOCK = threading.Lock()
_DTYPE_CODES: dict[Any, int] = {}
"""The ABI's dtype codes (``kernel_abi.DTYPE_CODES``) of the dtypes the native kernel takes, by
torch dtype (filled when it loads)."""


def triton_available() -> bool:
    global _TRITON
    if _TRITON is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _TRITON = True
        except Exception:  # noqa: BLE001 - absent or broken: PyTorch's ops serve
            _TRITON = False
    return _TRITON


def _arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def build_native(arch: str, cache: Path | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The native kernel's shared library for ``arch``, built with nvcc (``FORGE_NVCC``) unless the
    cache holds it (keyed by the source, the arch and the compiler). Raises RuntimeError with the
    reason when it cannot be built."""
    from ..roofline import cache_dir

    nvcc = os.environ.get("FORGE_NVCC", "nvcc")
    exe = shutil.which(nvcc)
    if exe is None:
        raise RuntimeError(f"{nvcc} not found on PATH")
    source = SOURCE.read_text()
    flags = ["-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC"]
    key = hashlib.sha256("\0".join([source, arch, exe, *flags]).encode()).hexdigest()[:20]
    folder = (cache or cache_dir()) / "runtime" / f"epilogue-{arch}-{key}"
    lib = folder / "libforge_epilogue.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="build-", suffix=".so")
    os.close(fd)
    try:
        try:
            proc = subprocess.run([exe, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"nvcc timed out after {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            first = next((ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln), "")
            raise RuntimeError(f"nvcc exited with status {proc.returncode}: {first.strip()[:200]}")
        os.replace(tmp, lib)  # whole or not at all: another process may be building it too
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def load_native(path: Path) -> Any:
    """The C entry point ``forge_epilogue`` of a built library, with its argument types."""
    fn = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL).forge_epilogue
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    return fn


def native() -> Any:
    """The native kernel's entry point, built and loaded on the first call (seconds: call it when a
    model is set up, never inside a capture), or None where it cannot be had (``native_why``: no
    GPU, no nvcc, a failed build or load)."""
    global _NATIVE, _NATIVE_WHY
    if _NATIVE is None:
        with _NATIVE_LOCK:
            if _NATIVE is None:
                try:
                    import torch

                    if not torch.cuda.is_available():
                        raise RuntimeError("no CUDA device")
                    _NATIVE = load_native(build_native(_arch()))
                    _DTYPE_CODES.update({torch.float32: 0, torch.float16: 1, torch.bfloat16: 2})
                except (RuntimeError, OSError, AttributeError) as exc:
                    _NATIVE, _NATIVE_WHY = False, str(exc) or type(exc).__name__
    return _NATIVE or None


def native_why() -> str:
    """Why the native kernel is not used ("" while it is, or before ``native`` was asked)."""
    return _NATIVE_WHY


def used(device: str, graphs: bool) -> bool:
    """Whether folds on ``device`` finish their outputs here rather than leave the bias, the sum
    and the ReLU to the forward's own ops: in CUDA graphs always (a pass saved on the device, the
    host not counting), op by op where the native kernel serves (``native``)."""
    return graphs or (device == "cuda" and native() is not None)


def way(device: str) -> str:
    """What finishes a fold's output on ``device``: the native kernel, Triton's, or PyTorch's ops."""
    if device == "cuda" and native() is not None:
        return "native kernel"
    if device == "cuda" and triton_available():
        return "Triton kernel"
    return "PyTorch ops"


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def bias_residual_relu(y_ptr, b_ptr, z_ptr, n, inner, channels, HAS_Z: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            ch = (offs // inner) % channels
            v = tl.load(y_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + ch, mask=m).to(tl.float32)
            if HAS_Z:
                v += tl.load(z_ptr + offs, mask=m).to(tl.float32)
            v = tl.maximum(v, 0.0)
            tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=m)

        _KERNEL = bias_residual_relu
    return _KERNEL


BLOCK = 2048
_LAUNCHED: set[tuple] = set()
"""The kernel's specialisations launched already (dtypes, with a residual or not)."""


def finish(y: Any, bias: Any, z: Any = None) -> Any:
    """``relu(y + bias[channel] (+ z))`` written into ``y`` (a fresh, contiguous convolution output,
    channels on dim 1) and returned."""
    import torch

    if y.is_cuda and _NATIVE:
        code = _DTYPE_CODES.get(y.dtype)
        if code is not None and bias.dtype is y.dtype and y.is_contiguous() and bias.is_contiguous() and \
                (z is None or (type(z) is torch.Tensor and z.dtype is y.dtype and z.is_contiguous()
                               and z.get_device() == y.get_device())):
            n = y.numel()
            index = y.get_device()
            rc = _NATIVE(y.data_ptr(), bias.data_ptr(), None if z is None else z.data_ptr(), n,
                         n // max(y.shape[0] * y.shape[1], 1), y.shape[1], code, torch._C._cuda_getCurrentRawStream(index))
            if rc == 0:
                return y
            _native_failed(rc)  # the launch did not run: y is as the convolution left it
    inner = 1
    for d in y.shape[2:]:
        inner *= d
    fused = (y.is_cuda and triton_available() and y.is_contiguous() and bias.is_contiguous()
             and (z is None or (z.is_contiguous() and z.dtype == y.dtype and z.device == y.device)))
    key = (y.dtype, bias.dtype, z is not None)
    if fused and key not in _LAUNCHED and torch.cuda.is_current_stream_capturing():
        fused = False  # a first launch compiles and loads the kernel, which a capture cannot hold
    if fused:
        n = y.numel()
        _kernel()[((n + BLOCK - 1) // BLOCK,)](y, bias, y if z is None else z, n, inner, y.shape[1],
                                                HAS_Z=z is not None, BLOCK=BLOCK)
        _LAUNCHED.add(key)
        return y
    shape = [1, -1] + [1] * (y.dim() - 2)
    y.add_(bias.view(shape))
    if z is not None:
        y.add_(z)
    return y.relu_()


def _native_failed(rc: int) -> None:
    """A launch the native kernel refused: it is not used again in this process (the ops serve)."""
    global _NATIVE, _NATIVE_WHY
    _NATIVE, _NATIVE_WHY = False, f"its launch returned CUDA error {rc}"
