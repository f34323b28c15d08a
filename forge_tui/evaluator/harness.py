"""What the judge's correctness checks and its timing share: the failures they raise, the poison
written into outputs and workspaces before every call, a byte view that compares tensors exactly,
and the device's synchronisation (a sticky CUDA error there is fatal to the worker)."""

from __future__ import annotations


class CandidateFailure(Exception):
    """The candidate broke a rule; ``kind`` names which."""

    def __init__(self, kind: str, message: str, detail: dict | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail or {}


class FatalDeviceError(Exception):
    """The device is in an unusable state (sticky CUDA error); the worker must restart."""


POISON_FLOAT = (-1.2345e4, float("nan"))
"""The first call of each set sees a finite sentinel (an element left unwritten is then certain,
not confused with a NaN the candidate computed), the second NaN."""
POISON_INT = (-0x5A5A5A5A, 0x2B2B2B2B)


def fill_poison(t, which: int) -> None:
    import torch

    if t.dtype == torch.bool:
        t.fill_(which == 0)
    elif t.is_floating_point():
        t.fill_(POISON_FLOAT[which])
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(max(min(POISON_INT[which], info.max), info.min))




WORKSPACE_POISON = (0xFF, 0x7F)  # bytes: NaN / a huge finite float, -1 / a huge integer


def as_bytes(t):
    """A view of t's bytes (bitwise comparison that treats NaN payloads exactly)."""
    import torch

    c = t.contiguous().reshape(-1)
    return c.view(torch.uint8) if c.numel() else c



def sync_device(device: str) -> None:
    if device == "cuda":
        import torch

        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:  # sticky errors: illegal address, misaligned access, trap
            raise FatalDeviceError(str(exc).strip().splitlines()[0]) from None
