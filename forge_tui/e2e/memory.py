"""The process's memory between timed variants: the garbage collector's pauses kept out of the
timed forwards, and what the variants held handed back to the device."""

from __future__ import annotations

from typing import Any


def free_memory() -> None:
    """What the process no longer references, collected and handed back to the device (CUDA's
    caching allocator keeps freed blocks otherwise)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def release(variants: dict[str, Any], fns: dict[str, Any], names: tuple[str, ...]) -> None:
    """Drop the named variants (and their timed calls), then free the memory they held."""
    for name in names:
        variants.pop(name, None)
        fns.pop(name, None)
    free_memory()


class GcPauses:
    """The garbage collector's pauses during timed forwards, by variant (``gc.callbacks``); while
    active, what the process had built before (models, compiled graphs) is frozen out of the
    collector's scans (``gc.freeze``, as a server does once it has loaded), so that no variant pays
    for scanning another's objects. A collection during a timed forward is rare; the notes say so
    where one runs."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.pauses: dict[str, list[float]] = {}
        self._t0 = 0

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        self.current = name
        try:
            return fn(*args)
        finally:
            self.current = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        import time

        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self.current is not None:
            self.pauses.setdefault(self.current, []).append((time.perf_counter_ns() - self._t0) / 1e6)

    def __enter__(self) -> "GcPauses":
        import gc

        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        gc.callbacks.remove(self._callback)
        gc.unfreeze()

    def notes(self) -> list[str]:
        return [f"garbage collection in the timed {name} forwards: {len(ms)} pauses, {sum(ms):.1f} ms in all, "
                f"the longest {max(ms):.1f} ms" for name, ms in sorted(self.pauses.items()) if ms]
