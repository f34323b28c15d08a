"""``BenchOptions``: how ``bench`` measures a workload (device, repeats, which variants, which
switch-offs), built by ``forge bench``, the app's bench and ``bench/e2e_bench.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ForgeError


@dataclass(frozen=True)
class BenchOptions:
    """The bench's settings; the defaults are ``forge bench``'s."""

    device: str | None = None
    """"cpu", "cuda" or None for the best available (``resolve_device``)."""
    dtype: Any = None
    """The dtype the workload is built in; None for the workload's own."""
    repeats: int = 20
    """Timed forwards of each variant, interleaved."""
    warmup: int = 3
    """Untimed forwards of each variant before the timed ones."""
    with_compile: bool = True
    """Also time torch.compile and torch.compile + forge."""
    compile_backend: str = "inductor"
    """The backend torch.compile hands the compiled graphs to."""
    only_faster: bool = True
    """Serve only the kernels whose evidence says they are faster (``apply``'s ``only_faster``)."""
    graphs: bool = False
    """On cuda, also eager and eager + forge captured in CUDA graphs."""
    switch_off: bool = True
    """Switch off in the manifest the kernels that make the whole forward slower."""
    switch_off_compile: bool | None = None
    """The torch.compile verdict alone on or off; None: as ``switch_off``."""
    own_process_check: bool = True
    """Confirm a verdict to keep the kernels in compiled models in a process of its own."""
    own_process_deadline: float | None = None
    """A ``time.time()`` by which that process must end; None for no deadline."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ForgeError(f"repeats must be at least 1, got {self.repeats}")
        if self.warmup < 0:
            raise ForgeError(f"warmup must be 0 or more, got {self.warmup}")

    def compile_verdict(self) -> bool:
        """Whether the torch.compile switch-off runs: ``switch_off_compile`` where given, else
        ``switch_off``."""
        return self.switch_off if self.switch_off_compile is None else self.switch_off_compile
