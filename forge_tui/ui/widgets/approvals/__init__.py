"""Panes, one module each, grouped by feature."""
