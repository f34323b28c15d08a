"""forge-tui: searched, verified GPU kernels for unmodified PyTorch models."""

__version__ = "0.1.0"
