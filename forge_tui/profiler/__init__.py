"""Profiling a workload into operator cards."""
