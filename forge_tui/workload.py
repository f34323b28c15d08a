"""Workloads: a Python file that defines a model and example inputs.

Two formats are accepted, unchanged:

* forge: ``get_model()`` and ``get_inputs()`` (optional module constant ``DTYPE``);
* KernelBench: ``Model``, ``get_inputs()`` and ``get_init_inputs()``.

Bundled examples are named ``example:NAME`` (see ``forge examples``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from .errors import ForgeError, WorkloadError

DTYPE_ALIASES = {
    "fp32": "float32", "float32": "float32", "float": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}


def parse_dtype(name: str | None):
    """Map a user's dtype name to a torch dtype; None stays None."""
    import torch

    if name is None:
        return None
    key = DTYPE_ALIASES.get(name.strip().lower())
    if key is None:
        raise ForgeError(f"unsupported dtype '{name}': choose one of fp32, fp16, bf16")
    return getattr(torch, key)


def resolve_device(name: str | None) -> str:
    """'cuda', 'cpu' or None (auto). Asking for CUDA where there is none is an error, not a fallback."""
    import torch

    if name is None or name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cuda", "cpu"):
        raise ForgeError(f"unsupported device '{name}': choose cuda or cpu")
    if name == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ForgeError(
            f"--device cuda was asked for, but this machine has no usable CUDA device (torch {torch.__version__}, {build})"
        )
    return name


def _exc_line(exc: BaseException, path: Path) -> str:
    """The exception in one line, with the workload line it came from when there is one."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() == path.resolve():
            where = f" (line {frame.lineno})"
            break
    if isinstance(exc, SyntaxError) and exc.lineno:
        where = f" (line {exc.lineno})"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}{where}" if msg else f"{type(exc).__name__}{where}"


@contextmanager
def _on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


@dataclass
class Workload:
    path: Path
    name: str
    format: str  # "forge" or "kernelbench"
    module: ModuleType
    source_sha: str
    default_dtype: Any  # torch.dtype or None

    def build(self, device: str, dtype=None, seed: int = 0):
        """Instantiate the model and its inputs on ``device`` (random weights, seeded)."""
        import torch

        dtype = dtype if dtype is not None else self.default_dtype
        torch.manual_seed(seed)
        mod = self.module
        with _on_sys_path(self.path.parent):
            try:
                if self.format == "forge":
                    model = _call_with_optional(mod.get_model, device=device, dtype=dtype)
                else:
                    init = list(mod.get_init_inputs()) if hasattr(mod, "get_init_inputs") else []
                    model = mod.Model(*init)
            except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
                what = "get_model()" if self.format == "forge" else "Model(*get_init_inputs())"
                raise WorkloadError(f"{self.path.name}: {what} raised {_exc_line(exc, self.path)}") from None
            if not isinstance(model, torch.nn.Module):
                raise WorkloadError(
                    f"{self.path.name}: the model must be a torch.nn.Module, got {type(model).__name__}"
                )
            try:
                inputs = _call_with_optional(mod.get_inputs, device=device, dtype=dtype)
            except Exception as exc:  # noqa: BLE001
                raise WorkloadError(f"{self.path.name}: get_inputs() raised {_exc_line(exc, self.path)}") from None
        if isinstance(inputs, torch.Tensor):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)):
            raise WorkloadError(
                f"{self.path.name}: get_inputs() must return a list of inputs, got {type(inputs).__name__}"
            )
        model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
        inputs = [_move(x, device, dtype) for x in inputs]
        return model, inputs

    def run(self, model, inputs):
        """One forward, with the user's exceptions turned into a WorkloadError."""
        try:
            return model(*inputs)
        except Exception as exc:  # noqa: BLE001
            raise WorkloadError(f"{self.path.name}: the model raised {_exc_line(exc, self.path)} during forward") from None


def _call_with_optional(fn, **optional):
    """Call fn, passing only the keyword arguments its signature names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {k: v for k, v in optional.items() if k in params}
    return fn(**kwargs)


def _move(x, device, dtype):
    import torch

    if isinstance(x, torch.Tensor):
        x = x.to(device)
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
    return x


def resolve_path(spec: str | Path) -> Path:
    from .examples import EXAMPLES, example_path

    text = str(spec)
    if text.startswith("example:"):
        name = text.split(":", 1)[1]
        if name not in EXAMPLES:
            raise WorkloadError(f"no bundled example named '{name}' (forge examples lists them)")
        return example_path(name)
    return Path(text)


def load_workload(spec: str | Path) -> Workload:
    """Import a workload file and check it defines a model and inputs."""
    path = resolve_path(spec)
    if not path.exists():
        raise WorkloadError(f"workload file not found: {path}")
    if not path.is_file() or path.suffix != ".py":
        raise WorkloadError(f"workload must be a Python file: {path}")
    source = path.read_bytes()
    sha = hashlib.sha256(source).hexdigest()
    modname = f"forge_workload_{path.stem}_{sha[:12]}"
    if modname in sys.modules:
        module = sys.modules[modname]
    else:
        spec_ = importlib.util.spec_from_file_location(modname, path)
        if spec_ is None or spec_.loader is None:
            raise WorkloadError(f"workload cannot be imported: {path}")
        module = importlib.util.module_from_spec(spec_)
        sys.modules[modname] = module  # classes defined there must stay picklable by name
        with _on_sys_path(path.parent):
            try:
                spec_.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001
                del sys.modules[modname]
                raise WorkloadError(f"{path.name} failed to import: {_exc_line(exc, path)}") from None
    if callable(getattr(module, "get_model", None)) and callable(getattr(module, "get_inputs", None)):
        fmt = "forge"
    elif isinstance(getattr(module, "Model", None), type) and callable(getattr(module, "get_inputs", None)):
        fmt = "kernelbench"
    else:
        raise WorkloadError(
            f"{path.name} defines no model: expected get_model() and get_inputs(), "
            "or KernelBench's Model, get_inputs() and get_init_inputs()"
        )
    default_dtype = getattr(module, "DTYPE", None)
    return Workload(path=path.resolve(), name=path.stem, format=fmt, module=module,
                    source_sha=sha, default_dtype=default_dtype)
