"""The properties of the GPU that the CUDA templates' first choices and grid sizes depend on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KB = 1024


@dataclass(frozen=True)
class DeviceProps:
    """One GPU, as the templates see it. Sizes in bytes."""

    name: str
    sms: int
    """Streaming multiprocessors."""
    smem_per_sm: int
    """Shared memory of one multiprocessor (the 1 KB the runtime reserves per block included)."""
    smem_per_block: int
    """The most shared memory one block may use, once its kernel opts in past 48 KB."""
    l2_bytes: int
    capability: tuple[int, int]
    """Compute capability (major, minor)."""
    max_threads_per_sm: int

    @property
    def clusters(self) -> bool:
        """Thread-block clusters, distributed shared memory and bulk copies (TMA): sm_90 and later.
        The cluster, stash and ring modes need them."""
        return self.capability >= (9, 0)

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @classmethod
    def from_torch(cls, index: int | None = None) -> DeviceProps:
        """The properties of CUDA device ``index`` (the current device by default), through torch."""
        import torch

        # (Any: torch's type stubs lag behind the properties it reports)
        p: Any = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
        return cls(name=p.name, sms=p.multi_processor_count, smem_per_sm=p.shared_memory_per_multiprocessor,
                   smem_per_block=p.shared_memory_per_block_optin, l2_bytes=p.L2_cache_size,
                   capability=(p.major, p.minor), max_threads_per_sm=p.max_threads_per_multi_processor)


H200 = DeviceProps(name="NVIDIA H200", sms=132, smem_per_sm=228 * KB, smem_per_block=227 * KB,
                   l2_bytes=60 * KB * KB, capability=(9, 0), max_threads_per_sm=2048)
DEFAULT_DEVICE = H200
"""What the templates assume where no CUDA device is present (CI, compile-only runs)."""


def detect_device() -> DeviceProps:
    """The current CUDA device's properties, or DEFAULT_DEVICE where there is none."""
    try:
        import torch
    except ImportError:
        return DEFAULT_DEVICE
    if not torch.cuda.is_available():
        return DEFAULT_DEVICE
    return DeviceProps.from_torch()
