"""Template families, one module each; ``FAMILIES`` in matching order."""
