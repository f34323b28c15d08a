"""A code generator for pointwise and reduction programs: a card's captured aten program becomes
one fused kernel, for the cuda and the cpu backend.

    kern = analyze(card)          # the Kernel, or Unsupported with a one-line reason
    src = emit_cpu(kern, params, card) / emit_cuda(kern, params, card, device)
    outs = interpret(kern, card, inputs)   # the same computation in torch, no compiler

index.py       the index algebra (rows, columns, views and slices as arithmetic)
ir.py          the scalar graph, the ops' semantics (C and torch)
values.py      the lazy values a program lowers to; views.py, the view algebra over them
lower.py       program -> values, node by node through the lowerings table (lowerings/)
builder.py     values asked at an index -> the scalar graph's nodes, with eager's conversions
analyze.py     the kernel's domain (rows x cols, the column order) and the Kernel
interp.py      the torch interpreter of a Kernel
emit_cpu.py    C++ (OpenMP) sources; emit_cuda/, CUDA sources
family.py      the generated family: the parameter space the proposer walks (``Generated``)

Like the template families, it is built on forge_tui/kernels and imports nothing of
forge_tui/templates; the proposer (templates/registry.py) tries it after the hand-written families.
"""

from .analyze import Unsupported, analyze
from .family import Generated, kernel_or_reason

__all__ = ["Generated", "Unsupported", "analyze", "explain", "kernel_or_reason"]


def explain(card) -> str | None:
    """None when the generator expresses the card; else the one-line reason it cannot."""
    try:
        analyze(card)
    except Unsupported as exc:
        return str(exc)
    return None
