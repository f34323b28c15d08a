"""Promoted kernels back in the unmodified model: ``apply(model, workspace)`` (see ``apply.py``)."""
