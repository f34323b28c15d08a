"""What follows a folded convolution, in one pass: its bias, then a residual if any, then the ReLU.

PyTorch adds a convolution's bias in an elementwise kernel of its own after cuDNN's: on the H200 a
ResNet-50 with its batch norms folded spent 976 µs of its 3.3 ms of GPU time a forward adding
biases, then passed over the same tensors again for the residual adds and the ReLUs. Where the
traced forward applies a ReLU to the folded output (``relu(bn(conv(x)))``) or to its sum with
another tensor (``relu(bn(conv(x)) + z)``), the fold computes the convolution without its bias
and this module finishes the output in place: one read and one write of it (a Triton kernel on
CUDA where Triton is installed, as it is beside PyTorch's CUDA builds), else PyTorch's in-place
ops, each a pass of its own. Values are added in float32 and rounded once.

Only models captured in CUDA graphs get it (``Mode.CUDA_GRAPH``): a Triton launch from Python
costs the host about what the two ops it replaces do, and op by op ResNet-50 ran slower with it
(1.121x eager, against 1.289x with plain folds; bench/lab/fold_epilogue_ab.py), where in graphs it
took 1.1 ms of GPU time off a 3.3 ms forward (1.454x against 1.100x).
"""

from __future__ import annotations

from typing import Any

_KERNEL: Any = None
_TRITON: bool | None = None


def triton_available() -> bool:
    global _TRITON
    if _TRITON is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _TRITON = True
        except Exception:  # noqa: BLE001 - absent or broken: PyTorch's ops serve
            _TRITON = False
    return _TRITON


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def bias_residual_relu(y_ptr, b_ptr, z_ptr, n, inner, channels, HAS_Z: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            ch = (offs // inner) % channels
            v = tl.load(y_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + ch, mask=m).to(tl.float32)
            if HAS_Z:
                v += tl.load(z_ptr + offs, mask=m).to(tl.float32)
            v = tl.maximum(v, 0.0)
            tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=m)

        _KERNEL = bias_residual_relu
    return _KERNEL


BLOCK = 2048
_LAUNCHED: set[tuple] = set()
"""The kernel's specialisations launched already (dtypes, with a residual or not)."""


def finish(y: Any, bias: Any, z: Any = None) -> Any:
    """``relu(y + bias[channel] (+ z))`` written into ``y`` (a fresh, contiguous convolution output,
    channels on dim 1) and returned."""
    import torch

    inner = 1
    for d in y.shape[2:]:
        inner *= d
    fused = (y.is_cuda and triton_available() and y.is_contiguous() and bias.is_contiguous()
             and (z is None or (z.is_contiguous() and z.dtype == y.dtype and z.device == y.device)))
    key = (y.dtype, bias.dtype, z is not None)
    if fused and key not in _LAUNCHED and torch.cuda.is_current_stream_capturing():
        fused = False  # a first launch compiles and loads the kernel, which a capture cannot hold
    if fused:
        n = y.numel()
        _kernel()[((n + BLOCK - 1) // BLOCK,)](y, bias, y if z is None else z, n, inner, y.shape[1],
                                                HAS_Z=z is not None, BLOCK=BLOCK)
        _LAUNCHED.add(key)
        return y
    shape = [1, -1] + [1] * (y.dim() - 2)
    y.add_(bias.view(shape))
    if z is not None:
        y.add_(z)
    return y.relu_()
