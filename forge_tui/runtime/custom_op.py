"""A card as an operator of the ``forge`` library, so that a compiled graph keeps its kernel whole."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable

from ..ranges import output_layout
from .guard import Guard

if TYPE_CHECKING:
    import torch


_CUSTOM_OPS: dict[str, Any] = {}


_CUSTOM_GUARDS: dict[str, Guard] = {}


_LIBRARY: list[Any] = []


_OWN_OPS = itertools.count(1)
"""Numbers the custom ops defined for one guard alone (``custom_op(own=True)``)."""


def custom_op(guard: Guard, own: bool = False) -> Callable[[list["torch.Tensor"]], list["torch.Tensor"]]:
    """The card as an operator of the ``forge`` library (``torch.library``: a schema, one kernel for
    every backend, a fake implementation for the compilers), one per signature in this process, so
    a compiled model keeps the kernel as one opaque node. Defined with the library's own API rather
    than ``torch.library.custom_op``, whose autograd and dispatch layers in Python cost the host
    several times the call itself, paid at each of a compiled model's many such calls. Kernels
    serve inference: no autograd formula is registered, and the forwards that call the op send
    calls needing gradients to PyTorch's own code first."""
    import torch

    short = f"k_{guard.sig.digest()}"
    if own:  # this guard's alone: an op by signature serves the latest guard of its card
        if guard.own_op is not None:
            return guard.own_op  # type: ignore[no-any-return]
        short += f"_g{next(_OWN_OPS)}"
    name = f"forge::{short}"
    _CUSTOM_GUARDS[name] = guard
    if name not in _CUSTOM_OPS:
        specs = guard.sig.outputs

        def impl(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            g = _CUSTOM_GUARDS[name]
            outs = g.serve(list(inputs))
            if outs is not None:
                return outs
            outs = g.reference(list(inputs))
            # the schema promises fresh outputs: one that shares an input's memory is copied
            held = {t.untyped_storage().data_ptr() for t in inputs}
            return [o.clone() if o.untyped_storage().data_ptr() in held else o for o in outs]

        ranges = guard.sig.ranges

        def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            """The outputs' shapes and layouts: the card's, or, for a range card, sized from the
            call's inputs as its kernel sizes them (``ranges.output_layout``)."""
            dev = inputs[0].device if inputs else torch.device("cpu")
            outs = []
            for k, s in enumerate(specs):
                shape, stride = list(s.shape), list(s.stride)
                if ranges:
                    layout = output_layout(s.shape, s.stride, k, ranges, inputs)
                    if layout is None:
                        raise RuntimeError(f"{name}: output {k}'s size follows no input's")
                    shape, stride = layout[0], layout[1] or []
                dtype = getattr(torch, s.dtype)
                outs.append(torch.empty_strided(shape, stride, dtype=dtype, device=dev) if stride
                            else torch.empty(shape, dtype=dtype, device=dev))
            return outs

        if not _LIBRARY:
            _LIBRARY.append(torch.library.Library("forge", "FRAGMENT"))
        lib = _LIBRARY[0]
        lib.define(f"{short}(Tensor[] inputs) -> Tensor[]")
        lib.impl(short, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(name, fake, lib=lib)
        _CUSTOM_OPS[name] = getattr(torch.ops.forge, short).default
    if own:
        guard.own_op = _CUSTOM_OPS[name]
    return _CUSTOM_OPS[name]  # type: ignore[no-any-return]
