"""The C ABI of forge_kernel.h, seen from Python (ctypes), and a card's scalar arguments."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from .cards import TensorSpec

SOURCE_NAMES = {"cuda": "candidate.cu", "cpu": "candidate.cpp"}
"""The file a candidate's source is kept in, per backend: where the builder compiles it, in a search
node's commit and in the agent's working directory."""

HEADER_DIR = Path(__file__).resolve().parent / "abi"
HEADER = HEADER_DIR / "forge_kernel.h"
MAX_DIMS = 8
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4, "int32": 5,
               "int16": 6, "int8": 7, "uint8": 8, "bool": 9}
SCALAR_INT, SCALAR_FLOAT, SCALAR_BOOL, SCALAR_NONE = 0, 1, 2, 3
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
            "uint8": 1, "bool": 1}
"""Bytes an element, for each dtype of the ABI."""
CUDA_CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
              "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
              "bool": "bool"}
"""The C type of an element in generated and template CUDA code."""
CPU_CTYPE = {**CUDA_CTYPE, "float16": "fhalf", "bfloat16": "fbf16"}
"""The C++ type of an element in generated and template cpu code (fhalf and fbf16: cpu_common's
16-bit storage types)."""


class ForgeTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS)]


class ForgeScalar(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("reserved", ctypes.c_int32), ("i", ctypes.c_int64), ("f", ctypes.c_double)]


def describe(t: "torch.Tensor") -> ForgeTensor:
    d = ForgeTensor()
    d.data = t.data_ptr()
    d.dtype = DTYPE_CODES[str(t.dtype).removeprefix("torch.")]
    if t.dim() > MAX_DIMS:
        raise ValueError(f"tensor of rank {t.dim()} exceeds the ABI's {MAX_DIMS} dimensions")
    d.ndim = t.dim()
    for k, (s, st) in enumerate(zip(t.shape, t.stride())):
        d.shape[k] = s
        d.stride[k] = st
    return d


@dataclass(frozen=True)
class Scalar:
    name: str
    value: Any  # int, float, bool or None

    def to_c(self) -> ForgeScalar:
        s = ForgeScalar()
        if self.value is None:
            s.kind = SCALAR_NONE
        elif isinstance(self.value, bool):
            s.kind, s.i = SCALAR_BOOL, int(self.value)
        elif isinstance(self.value, int):
            s.kind, s.i = SCALAR_INT, self.value
        else:
            s.kind, s.f = SCALAR_FLOAT, float(self.value)
        return s


def _arg_names(op_name: str) -> list[str]:
    try:
        from .program import resolve_op

        return [a.name for a in resolve_op(op_name)._schema.arguments]
    except Exception:  # noqa: BLE001 - names are a courtesy; the values are what matter
        return []


def _walk(value: Any, name: str, out: list[Scalar]) -> None:
    if isinstance(value, dict):
        if "$in" in value or "$node" in value or any(k in value for k in ("$dtype", "$device", "$layout", "$memory_format")):
            return
        if "$float" in value:
            out.append(Scalar(name, float(value["$float"])))
            return
        for k, v in value.items():
            _walk(v, f"{name}.{k}", out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, f"{name}[{i}]", out)
    elif value is None or isinstance(value, (bool, int, float)):
        out.append(Scalar(name, value))


def card_scalars(program: dict[str, Any]) -> list[Scalar]:
    """The non-tensor arguments of a card's program, flattened in order, with schema names.

    Names read ``<node>.<argument>`` (``0.dim``, ``3.other``) and ``[i]`` for list elements.
    """
    out: list[Scalar] = []
    for i, node in enumerate(program["nodes"]):
        names = _arg_names(node["op"])
        for k, arg in enumerate(node["args"]):
            _walk(arg, f"{i}.{names[k] if k < len(names) else k}", out)
        for key, arg in node.get("kwargs", {}).items():
            _walk(arg, f"{i}.{key}", out)
    return out


MAX_WORKSPACE_BYTES = 8 << 30


class Library:
    """A loaded candidate: ``bind(inputs, outputs, scalars, stream, workspace)`` gives a launcher.

    A candidate exports either ``forge_launch`` or, when it needs scratch memory,
    ``forge_workspace_bytes`` and ``forge_launch_ws`` (see forge_kernel.h); ``needs_workspace``
    says which, and ``workspace_bytes`` asks the candidate how much for given arguments.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        common = [ctypes.POINTER(ForgeTensor), ctypes.c_int32, ctypes.POINTER(ForgeTensor), ctypes.c_int32,
                  ctypes.POINTER(ForgeScalar), ctypes.c_int32]
        plain = getattr(self._lib, "forge_launch", None)
        with_ws = getattr(self._lib, "forge_launch_ws", None)
        sizer = getattr(self._lib, "forge_workspace_bytes", None)
        if plain is not None and with_ws is not None:
            raise LookupError(f"{self.path.name} exports both forge_launch and forge_launch_ws; define exactly one")
        if with_ws is not None:
            if sizer is None:
                raise LookupError(f"{self.path.name} exports forge_launch_ws but not forge_workspace_bytes")
            sizer.restype = ctypes.c_int64
            sizer.argtypes = common
            with_ws.restype = ctypes.c_int
            with_ws.argtypes = common + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        elif plain is not None:
            plain.restype = ctypes.c_int
            plain.argtypes = common + [ctypes.c_void_p]
        else:
            raise LookupError(f"{self.path.name} does not export forge_launch (or forge_launch_ws)")
        self.needs_workspace = with_ws is not None
        self._fn: Any = with_ws if with_ws is not None else plain
        self._sizer: Any = sizer
        self.plain_launch: Any = plain
        """forge_launch itself, for a caller that keeps its descriptor arrays and has checked the
        arguments (the runtime's ``CardKernel``): what ``call_raw`` calls, without its checks.
        None for a candidate with a workspace."""
        self.ws_launch: Any = with_ws
        """forge_launch_ws itself, the same for a candidate with a workspace; None otherwise."""

    @staticmethod
    def _arrays(inputs: list["torch.Tensor"], outputs: list["torch.Tensor"],
                scalars: list[Scalar]) -> tuple[Any, Any, Any]:
        ins = (ForgeTensor * max(len(inputs), 1))(*[describe(t) for t in inputs])
        outs = (ForgeTensor * max(len(outputs), 1))(*[describe(t) for t in outputs])
        scs = (ForgeScalar * max(len(scalars), 1))(*[s.to_c() for s in scalars])
        return ins, outs, scs

    def workspace_bytes(self, inputs: list["torch.Tensor"], outputs: list["torch.Tensor"],
                        scalars: list[Scalar]) -> int:
        """Bytes of scratch the candidate asks for (0 when it needs none).

        Raises ValueError when the candidate refuses the arguments (negative) or asks for more
        than MAX_WORKSPACE_BYTES.
        """
        if not self.needs_workspace:
            return 0
        ins, outs, scs = self._arrays(inputs, outputs, scalars)
        assert self._sizer is not None  # exported whenever forge_launch_ws is
        n = int(self._sizer(ins, len(inputs), outs, len(outputs), scs, len(scalars)))
        if n < 0:
            raise ValueError(f"forge_workspace_bytes returned {n}: the candidate cannot serve these arguments")
        if n > MAX_WORKSPACE_BYTES:
            raise ValueError(f"forge_workspace_bytes asks for {n} bytes, over the {MAX_WORKSPACE_BYTES} allowed")
        return n

    def call_raw(self, ins: Any, n_in: int, outs: Any, n_out: int, scs: Any, n_sc: int, stream: int | None,
                 workspace: "torch.Tensor | None" = None) -> int:
        """One call on descriptor arrays the caller keeps (the runtime updates their data pointers
        per call instead of building them again)."""
        if self.needs_workspace:
            if workspace is None:
                raise ValueError("this kernel needs a workspace (forge_launch_ws) and none was given")
            return int(self._fn(ins, n_in, outs, n_out, scs, n_sc, workspace.data_ptr(),
                                workspace.numel() * workspace.element_size(), stream))
        return int(self._fn(ins, n_in, outs, n_out, scs, n_sc, stream))

    def bind(self, inputs: list["torch.Tensor"], outputs: list["torch.Tensor"], scalars: list[Scalar],
             stream: int | None, workspace: "torch.Tensor | None" = None) -> Callable[[], int]:
        """A no-argument callable that launches on fixed buffers (descriptors built once).

        ``workspace`` is a tensor of at least ``workspace_bytes()`` bytes, required when the
        candidate needs one.
        """
        ins, outs, scs = self._arrays(inputs, outputs, scalars)
        n_in, n_out, n_sc = len(inputs), len(outputs), len(scalars)
        fn = self._fn
        keep = (ins, outs, scs, workspace)
        if self.needs_workspace:
            if workspace is None:
                raise ValueError("this candidate needs a workspace (forge_launch_ws) and none was given")
            ws_ptr, ws_bytes = workspace.data_ptr(), workspace.numel() * workspace.element_size()

            def call_ws() -> int:
                _ = keep
                return int(fn(ins, n_in, outs, n_out, scs, n_sc, ws_ptr, ws_bytes, stream))

            return call_ws

        def call() -> int:
            _ = keep
            return int(fn(ins, n_in, outs, n_out, scs, n_sc, stream))

        return call


WORKSPACE_ALIGN = 256


def default_cuda_arch() -> str:
    """sm_XY of the visible GPU; sm_90 (Hopper) when there is none, e.g. for compile-only CI."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001
        pass
    return "sm_90"


def current_arch(backend: str) -> str:
    """What a build for this machine is called: sm_XY on CUDA, the processor (``uname -m``) on the
    CPU, where builds use -march=native."""
    if backend == "cuda":
        return default_cuda_arch()
    import platform

    return platform.machine() or "cpu"


def alloc_workspace(nbytes: int, device: str) -> "torch.Tensor":
    """A uint8 tensor of nbytes (at least 1) starting on a WORKSPACE_ALIGN-byte boundary."""
    import torch

    raw = torch.empty(max(nbytes, 1) + WORKSPACE_ALIGN, dtype=torch.uint8, device=device)
    off = (-raw.data_ptr()) % WORKSPACE_ALIGN
    return raw[off: off + max(nbytes, 1)]


def workspace_for(lib: Library, ins: list["torch.Tensor"], outs: list["torch.Tensor"], scalars: list[Scalar],
                  device: str) -> "torch.Tensor | None":
    """The scratch buffer a library asks for on these arguments, or None when it uses plain
    forge_launch. Raises ValueError when it refuses them or asks for too much."""
    if not lib.needs_workspace:
        return None
    return alloc_workspace(lib.workspace_bytes(ins, outs, scalars), device)


def alloc_outputs(specs: list["TensorSpec"], device: str) -> list["torch.Tensor"]:
    """Output tensors with the specs' shapes, dtypes and (where PyTorch can) strides."""
    import torch

    outs = []
    for s in specs:
        dtype = getattr(torch, s.dtype)
        try:
            outs.append(torch.empty_strided(s.shape, s.stride, dtype=dtype, device=device))
        except RuntimeError:
            outs.append(torch.empty(s.shape, dtype=dtype, device=device))
    return outs
