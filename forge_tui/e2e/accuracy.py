"""Whether each variant's outputs agree with the output it is checked against, within a
whole-model tolerance, and where they miss it, whether they are as accurate against the model
run in fp32."""

from __future__ import annotations

import copy
import math
from typing import Any

from ..compare import compare
from ..program import tensor_leaves

CHUNK = 1 << 24
"""Elements of an output compared at a time: a decoder's logits (4 x 1024 x 262144) in float64,
with the comparison's masks, would take tens of GB at once."""


def _slices(x: Any, y: Any) -> Any:
    """Flat slices of ``CHUNK`` elements of two tensors of one shape, in step."""
    xf, yf = x.reshape(-1), y.reshape(-1)
    for start in range(0, max(yf.numel(), 1), CHUNK):
        yield start, xf[start:start + CHUNK], yf[start:start + CHUNK]


def _rms(y: Any) -> float:
    """The root mean square of a floating tensor, a slice at a time."""
    total = sum(float(ys.double().pow(2).sum()) for _, _, ys in _slices(y, y))
    return (total / max(y.numel(), 1)) ** 0.5


def _agree(got: Any, ref: Any, ref_name: str = "eager") -> str | None:
    a, b = tensor_leaves(got), tensor_leaves(ref)
    if len(a) != len(b):
        return f"{len(a)} outputs where {ref_name} has {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        # whole-model tolerance: a fused kernel rounds once where eager rounds at every op
        dt = str(y.dtype).removeprefix("torch.")
        loose = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2), "bfloat16": (4e-2, 4e-2)}.get(dt)
        rtol, atol = loose if loose else (None, None)
        scale = _rms(y) if y.is_floating_point() else None
        if x.shape != y.shape or x.dtype != y.dtype or y.numel() <= CHUNK:
            m = compare(x, y, i, rtol=rtol, atol=atol, scale=scale)
            if m is not None:
                return str(m)
            continue
        for start, xs, ys in _slices(x, y):
            m = compare(xs, ys, i, rtol=rtol, atol=atol, scale=scale)
            if m is not None:
                return f"{m} (of its elements {start} to {start + ys.numel() - 1}, in a flat order)"
    return None


CHECKED_AGAINST = {"compile+forge": "compile", "eager+forge (graph)": "eager (graph)"}
"""What each variant's outputs are checked against (eager where not named): torch.compile's own
rounding is not forge's to answer for, so torch.compile + forge is held to torch.compile."""

ACCURACY_SLACK = 1.1
"""A variant outside the element tolerance still agrees when its error against the model run in
fp32 is at most this many times that of the output it is checked against, or of eager's where
that is larger: never less accurate than eager (routing by top-k or a
threshold turns a last-bit difference into a different path for a few tokens: eager's own bf16
run differs from fp32 the same way)."""


def _floats(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_floats(v) for v in x)
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    return x


def run_fp32(wl: Any, model: Any, inputs: Any) -> Any:
    """The model's outputs with its weights and floating inputs in fp32 (a copy: ``model`` is left
    as it is); None when the model will not run so."""
    try:
        m32 = copy.deepcopy(model).float()
        return wl.run(m32, _floats(inputs))
    except Exception:  # noqa: BLE001 - a model written for one dtype: no fp32 judgement, the mismatch stands
        return None


def relative_error(got: Any, ref: Any) -> float | None:
    """||got - ref|| / ||ref|| over every floating output (inf where their non-finite values
    disagree); None where there is no floating output."""
    import torch

    num = den = 0.0
    floats = False
    for x, y in zip(tensor_leaves(got), tensor_leaves(ref)):
        if not y.is_floating_point():
            continue
        floats = True
        for _, xs, ys in _slices(x, y):
            xs, ys = xs.double(), ys.double()
            fx, fy = torch.isfinite(xs), torch.isfinite(ys)
            if not torch.equal(fx, fy):
                return float("inf")
            num += float((xs[fx] - ys[fy]).pow(2).sum())
            den += float(ys[fy].pow(2).sum())
    if not floats:
        return None
    return (num / den) ** 0.5 if den > 0 else (0.0 if num == 0 else float("inf"))


def _exact_where_not_float(got: Any, ref: Any) -> bool:
    """Every integer and bool output equal to the reference's (a routing flip excuses rounding
    in floating outputs, never a different index or mask)."""
    import torch

    return all(torch.equal(x, y) for x, y in zip(tensor_leaves(got), tensor_leaves(ref)) if not y.is_floating_point())


def judge_outputs(outs: dict[str, Any], ref: Any, fp32: Any) -> tuple[dict[str, str | None], dict[str, dict[str, Any]]]:
    """Each variant against eager's outputs (or what CHECKED_AGAINST names) within the whole-model
    tolerance; one outside it is judged again against the model in fp32 (``fp32()``, run once and
    only if needed) and agrees if it is as accurate as what it was checked against."""
    agree: dict[str, str | None] = {}
    accuracy: dict[str, dict[str, Any]] = {}
    ref32: list[Any] = []
    for name, out in outs.items():
        base_name = CHECKED_AGAINST.get(name, "eager")
        base = outs[base_name] if base_name in outs else ref
        base_name = base_name if base_name in outs else "eager"
        m = _agree(out, base, base_name)
        agree[name] = m
        if m is None:
            continue
        if not ref32:
            ref32.append(fp32())
        if ref32[0] is None or len(tensor_leaves(ref32[0])) != len(tensor_leaves(out)) \
                or not _exact_where_not_float(out, base):
            continue
        err, base_err = relative_error(out, ref32[0]), relative_error(base, ref32[0])
        if err is None or base_err is None:
            continue
        if base_name != "eager":  # held to the less accurate of its baseline and eager: never worse than eager
            eager_err = relative_error(ref, ref32[0])
            if eager_err is not None and math.isfinite(eager_err) and eager_err > base_err:
                base_err, base_name = eager_err, "eager"
        accuracy[name] = {"error": err, "baseline_error": base_err, "baseline": base_name, "outside": m}
        # a baseline whose own error is not finite (an overflow in eager) vouches for nothing
        if math.isfinite(base_err) and err <= ACCURACY_SLACK * base_err:
            agree[name] = None
        else:
            agree[name] = (f"{m}; against the model in fp32 its relative error is {err:.3g}, {base_name}'s "
                           f"{base_err:.3g}")
    return agree, accuracy
