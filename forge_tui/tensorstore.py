"""Content-addressed store for captured tensors, outside git.

A tensor is stored with its exact layout: the span of its storage that it can reach (from its
storage offset to its last element), plus shape and strides, so expanded, transposed or sliced
inputs come back with the strides they were captured with. The key is a SHA-256 of the bytes and
the layout.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def storage_extent(shape, stride) -> int:
    """Elements of storage a tensor with this layout touches (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def span(t):
    """The storage span a tensor's layout reaches, as a flat view (same extent for same layouts)."""
    return t.as_strided((storage_extent(tuple(t.shape), tuple(t.stride())),), (1,), t.storage_offset())


def pack(t):
    """(flat CPU copy, shape, stride, mode) that ``unpack`` turns back into the same layout.

    mode "span": the storage span the tensor reaches (exact for any layout, expanded ones too);
    used unless that span is much larger than the tensor (a thin slice of a big buffer).
    mode "dense": the values in row-major order, re-laid out with the original strides.
    """
    import torch

    shape, stride = tuple(t.shape), tuple(t.stride())
    n = storage_extent(shape, stride)
    t = t.detach()
    if n == 0:
        return torch.empty(0, dtype=t.dtype), shape, stride, "span"
    if n <= 2 * t.numel():
        return span(t).to("cpu", copy=True), shape, stride, "span"
    return t.contiguous().view(-1).to("cpu", copy=True), shape, stride, "dense"


def unpack(flat, shape, stride, mode: str = "span", device: str = "cpu"):
    import torch

    flat = flat.to(device)
    if storage_extent(shape, stride) == 0:
        return torch.empty(shape, dtype=flat.dtype, device=device)
    if mode == "dense":
        out = torch.empty_strided(shape, stride, dtype=flat.dtype, device=device)
        out.copy_(flat.view(shape))
        return out
    return flat.as_strided(shape, stride, 0)


def _digest(flat, shape, stride, mode) -> str:
    import torch

    h = hashlib.sha256()
    h.update(f"{flat.dtype}|{tuple(shape)}|{tuple(stride)}|{mode}|".encode())
    if flat.numel():
        h.update(memoryview(flat.contiguous().view(torch.uint8).numpy()))
    return h.hexdigest()


class TensorStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pt"

    def put(self, t) -> str:
        return self.put_packed(pack(t))

    def put_packed(self, packed) -> str:
        """Store the result of ``pack`` (the capture keeps tensors packed on the CPU)."""
        import torch

        flat, shape, stride, mode = packed
        key = _digest(flat, shape, stride, mode)
        dest = self.path(key)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".tmp")
            os.close(fd)
            try:
                torch.save({"flat": flat, "shape": list(shape), "stride": list(stride), "mode": mode}, tmp)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return key

    def has(self, key: str) -> bool:
        return self.path(key).exists()

    def get(self, key: str, device: str = "cpu"):
        import torch

        p = self.path(key)
        if not p.exists():
            raise FileNotFoundError(f"tensor {key[:12]} is not in the store {self.root}")
        d = torch.load(p, map_location="cpu", weights_only=True)
        return unpack(d["flat"], tuple(d["shape"]), tuple(d["stride"]), d["mode"], device)
