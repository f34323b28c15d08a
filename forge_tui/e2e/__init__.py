"""``forge bench WORKLOAD -w WS``: the whole forward four ways (eager, eager + forge, torch.compile,
torch.compile + forge), timed interleaved in one process with spread, outputs checked against
eager (torch.compile + forge against torch.compile), and where they miss the tolerance, for
accuracy against the model run in fp32. A kernel that makes the whole forward slower is switched off in the manifest: kernels are
used only where they measured faster in the model, not only in isolation. When torch.compile +
forge runs slower than torch.compile, the kernels it served are switched off for compiled models.

The modules: ``options`` (``BenchOptions``, how to measure), ``driver`` (``bench``), ``result``
(``BenchResult``, its JSON and table), ``accuracy`` (whether outputs agree), ``graphs`` (CUDA
graphs, whole or in pieces), ``bounds`` (what the served cards promise), ``memory`` (the
collector's pauses and the device's memory), ``scopes`` (notes on compiled scopes), the three
switch-off policies (``switch_off`` in eager models, ``switch_off_compile`` under torch.compile,
``switch_off_graphs`` in CUDA graphs) and ``own_process`` (the check in a process of its own).
"""

from .driver import bench
from .options import BenchOptions
from .result import AFTER_SWITCH_OFF, FRESH_COMPILE, BenchResult

__all__ = ["AFTER_SWITCH_OFF", "FRESH_COMPILE", "BenchOptions", "BenchResult", "bench"]
