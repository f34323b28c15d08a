"""forge-tui: searched, verified GPU kernels for unmodified PyTorch models."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "generate", "GeneratedOp"]


def __getattr__(name: str) -> Any:
    """``generate`` and ``GeneratedOp`` load on first use (importing forge_tui stays cheap: no torch)."""
    if name in ("generate", "GeneratedOp"):
        from . import generated

        return getattr(generated, name)
    raise AttributeError(f"module 'forge_tui' has no attribute {name!r}")
