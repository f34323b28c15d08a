"""Input tensors for a card: its captured samples, or fresh random ones drawn from its specs.

Random sets vary the distribution per draw (normal, a few large outliers, wide uniform,
positive-only, small magnitudes; the first three are the default three sets) and never produce all zeros. Inputs whose captured values had
a restricted domain keep it: integer indices stay within the captured range, tensors that were
never negative (variances, probabilities) stay non-negative.

Adversarial sets (``adversarial_inputs``) target the approximations that ordinary random values
let through: exponentials without the max subtraction (``overflow``), normalisations without an
epsilon (``zeros``, ``tiny``), one-pass variances (``offset``), and NaN/Inf handling
(``special``); ``card_kinds`` says which of them apply to a card. ``fresh_inputs_into`` redraws
the contents of existing input tensors in place (before timed runs).
"""

from __future__ import annotations

from .cards import Card, TensorSpec
from .tensorstore import TensorStore, span, storage_extent

DISTRIBUTIONS = ("normal", "outliers", "uniform", "positive", "small")


def _as_layout(values, spec: TensorSpec, device: str):
    """``values`` (row-major) laid out with the spec's strides."""
    import torch

    n = storage_extent(spec.shape, spec.stride)
    if n < values.numel():
        # Overlapping (expanded) layout: fill the storage it reaches, then view it.
        return values.reshape(-1)[:n].to(device).as_strided(spec.shape, spec.stride, 0)
    out = torch.empty_strided(spec.shape, spec.stride, dtype=values.dtype, device=device)
    out.copy_(values.to(device))
    return out


def _draw_values(spec: TensorSpec, shape, gen, draw: int, cast: bool = True):
    """Random values of the spec's dtype and domain, of ``shape`` (row-major), generated on
    ``gen``'s device with ``gen``. The distribution is picked by ``draw`` (floating point only).
    With ``cast=False`` floating values stay float32 (a ``copy_`` into the destination rounds
    them exactly as ``.to(dtype)`` would, in the same pass)."""
    import torch

    dtype = getattr(torch, spec.dtype)
    dev = gen.device
    lo, hi = spec.value_range if spec.value_range is not None else (None, None)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen, device=dev) < 0.5
    if not dtype.is_floating_point:
        a = int(lo) if lo is not None else 0
        b = int(hi) if hi is not None else 16
        return torch.randint(a, b + 1, shape, generator=gen, dtype=torch.int64, device=dev).to(dtype)
    kind = DISTRIBUTIONS[draw % len(DISTRIBUTIONS)]
    nonneg = lo is not None and lo >= 0
    if kind == "normal":
        vals = torch.randn(shape, generator=gen, device=dev)
    elif kind == "uniform":
        vals = torch.rand(shape, generator=gen, device=dev) * 8 - 4
    elif kind == "positive":
        vals = torch.rand(shape, generator=gen, device=dev) * 3 + 0.05
    elif kind == "small":
        vals = torch.randn(shape, generator=gen, device=dev) * 1e-2
    else:  # outliers: mostly normal, ~1% of elements 20x larger
        vals = torch.randn(shape, generator=gen, device=dev)
        mask = torch.rand(shape, generator=gen, device=dev) < 0.01
        vals = torch.where(mask, vals * 20, vals)
    if nonneg:
        vals = vals.abs()
        if lo is not None and lo > 0:
            vals = vals + 1e-3
    if lo is not None and hi is not None and spec.role in ("param", "const"):
        # Parameters keep the captured scale (e.g. norm weights near 1).
        mid, half = (lo + hi) / 2, max((hi - lo) / 2, 1e-3)
        vals = mid + half * torch.tanh(vals)
    if 0 < vals.numel() <= 64:
        # never all zeros (a real chance for a handful of elements only); no value read back, so
        # no device synchronisation
        vals = torch.where((vals == 0).all(), vals + 1.0, vals)
    return vals.to(dtype) if cast else vals


def random_tensor(spec: TensorSpec, device: str, gen, draw: int = 0):
    """A random tensor with the spec's shape, strides and dtype; ``draw`` picks the distribution."""
    return _as_layout(_draw_values(spec, spec.shape, gen, draw), spec, device)


def random_inputs(card: Card, device: str, seed: int, draw: int | None = None) -> list:
    import torch

    # generated where they are used: drawing a large set on the CPU and copying it to the GPU costs
    # far more than the evaluation that uses it
    gen = torch.Generator(device).manual_seed(seed)
    d = seed if draw is None else draw
    return [random_tensor(s, device, gen, d) for s in card.inputs]


def sample_inputs(card: Card, store: TensorStore, index: int, device: str) -> list:
    return [store.get(k, device) for k in card.samples[index].inputs]


def sample_outputs(card: Card, store: TensorStore, index: int, device: str) -> list:
    return [store.get(k, device) for k in card.samples[index].outputs]


# ---- fresh contents in place ------------------------------------------------------------------

def fresh_inputs_into(card: Card, tensors: list, gen, draw: int) -> None:
    """Write fresh random contents into existing input tensors, in place.

    ``tensors`` are the card's inputs in card order (any layout: views into shared memory,
    slices with gaps, overlapping expanded strides). Each gets values drawn as ``random_tensor``
    draws them for ``draw`` (same distributions, value ranges and roles). A tensor whose layout
    overlaps itself has the storage span it reaches filled (as ``_as_layout`` does); any other
    has exactly its elements written. Values are generated on ``gen``'s device (a CUDA generator
    keeps the whole refill on the GPU: a few kernels per tensor, no synchronisation) and copied
    to the tensor's device when they differ.
    """
    for spec, t in zip(card.inputs, tensors):
        shape, stride = tuple(t.shape), tuple(t.stride())
        n = storage_extent(shape, stride)
        if n == 0:
            continue
        if n < t.numel():
            span(t).copy_(_draw_values(spec, (n,), gen, draw, cast=False))
        else:
            t.copy_(_draw_values(spec, shape, gen, draw, cast=False))


# ---- near-duplicate inputs ----------------------------------------------------------------------

def _same(a, b) -> bool:
    """Whether two one-element tensors hold the same bits (NaN payloads included)."""
    import torch

    if a.is_floating_point():
        as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
        return bool(a.view(as_int) == b.view(as_int))
    return bool(a == b)


def change_one_element(t, rng) -> tuple[int, ...] | None:
    """Change one element of ``t`` in place, at a place drawn from ``rng`` (a ``random.Random``),
    to another value the tensor already holds elsewhere, so that its domain holds (indices stay in
    range, masks stay masks, non-negative values stay so). Where every element holds the same
    value, a float gets that value plus one, a bool its negation, an integer the next one. Returns
    the element's index, or None for a tensor of fewer than two elements."""
    import torch

    n = t.numel()
    if n < 2:
        return None
    flat = t.reshape(-1)  # read from: a copy where t is not contiguous
    p = rng.randrange(n)
    cur = flat[p:p + 1]
    value = None
    for _ in range(16):
        q = rng.randrange(n)
        if not _same(flat[q:q + 1], cur):
            value = flat[q].clone()
            break
    if value is None:
        if t.is_floating_point():
            differs = (flat != cur) & ~(torch.isnan(flat) & torch.isnan(cur))
        else:
            differs = flat != cur
        others = torch.nonzero(differs).reshape(-1)
        if others.numel():
            value = flat[int(others[rng.randrange(others.numel())])].clone()
        elif t.dtype == torch.bool:
            value = ~cur[0]
        elif t.is_floating_point():
            value = cur[0] + 1
        else:
            value = cur[0] + 1 if int(cur[0]) < torch.iinfo(t.dtype).max else cur[0] - 1
    idx = []
    for size in reversed(t.shape):
        idx.append(p % size)
        p //= size
    where = tuple(reversed(idx))
    t[where] = value
    return where


def clone_layout(t):
    """A copy of ``t`` with its shape, strides and storage span (an overlapping, expanded layout
    stays one: ``clone`` would make it dense)."""
    import torch

    c = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
    if t.numel():
        span(c).copy_(span(t))
    return c


def near_duplicates(card: Card, base: list, steps: int, rng) -> list[tuple[list, str]]:
    """Inputs a kernel that keeps state across calls answers wrongly: ``base``, then ``steps`` sets
    each a copy of the one before with one element changed at a random place (the card's inputs
    of role "input" in turn, where it has some of two or more elements; else any such input), then
    ``base`` again after the others. Each with what sets it apart from the one before. A memo
    keyed on a fingerprint of a few elements returns the previous call's result for most of these;
    a kernel whose result drifts with its history misses base's the second time."""
    changeable = [i for i, s in enumerate(card.inputs) if s.numel >= 2 and s.role == "input"] or \
        [i for i, s in enumerate(card.inputs) if s.numel >= 2]
    out: list[tuple[list, str]] = [(base, "the first of the sequence")]
    cur = base
    for k in range(steps if changeable else 0):
        which = changeable[k % len(changeable)]
        cur = [clone_layout(t) for t in cur]
        at = change_one_element(cur[which], rng)
        out.append((cur, f"input {which} differs from the call before at element {list(at or ())}"))
    if len(out) > 1:
        out.append((base, "the first input of the sequence again"))
    return out


# ---- adversarial sets -------------------------------------------------------------------------

EXP_OPS = frozenset({
    "softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "logsumexp", "exp", "exp2",
    "expm1", "sigmoid", "log_sigmoid", "log_sigmoid_forward", "silu", "gelu", "tanh", "softplus", "elu",
    "selu", "celu", "mish", "glu", "logaddexp", "logaddexp2", "sinh", "cosh", "logit",
    "scaled_dot_product_attention", "_softmax_backward_data", "_log_softmax_backward_data",
})
EXP_PREFIXES = ("_scaled_dot_product", "_fused_sdp", "_flash_attention", "_efficient_attention")
NORM_OPS = frozenset({
    "native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "batch_norm", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "_batch_norm_impl_index", "_batch_norm_with_update", "_batch_norm_no_update", "batch_norm_stats",
    "cudnn_batch_norm", "miopen_batch_norm", "instance_norm", "rsqrt", "var", "var_mean", "std", "std_mean",
    "norm", "linalg_vector_norm", "linalg_norm", "frobenius_norm", "rms_norm", "_fused_rms_norm", "renorm",
})
SQUARE_OPS = frozenset({"pow", "mul", "square"})


def _op_base(op: str) -> str:
    """'aten._softmax.default' -> '_softmax'; in-place forms lose their underscore ('exp_' -> 'exp')."""
    parts = op.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        name = name[:-1]
    return name


def card_kinds(card: Card) -> set[str]:
    """Which approximations a card's program invites, from its aten ops (their base names).

    "exp": an exponential-type op (softmax and log-softmax variants, logsumexp, exp/exp2/expm1,
    sigmoid, SiLU, GELU, tanh, softplus, ELU, Mish, attention...): the ``overflow`` set applies.
    "norm": a normalisation or a division by a statistic (layer/group/batch/RMS norm, rsqrt,
    var/std, vector norms, or a mean taken together with a pow/mul, as in a hand-written
    RMSNorm): the ``zeros``, ``tiny`` and ``offset`` sets apply.
    """
    names = {_op_base(n.get("op", "")) for n in (card.program or {}).get("nodes", [])}
    kinds: set[str] = set()
    if names & EXP_OPS or any(n.startswith(EXP_PREFIXES) for n in names):
        kinds.add("exp")
    if names & NORM_OPS or ("mean" in names and names & SQUARE_OPS):
        kinds.add("norm")
    return kinds


ADVERSARIAL_SETS = ("overflow", "zeros", "tiny", "offset", "special")
OVERFLOW_CENTRE = 90.0
"""exp(x) overflows fp32 and bf16 above ~88.7; rows centred here (spread 1.5) overflow it."""
OFFSET = 12.0
"""Common offset of the "offset" set (one sign for the whole tensor, unit noise): large enough that
a one-pass E[x^2]-E[x]^2 fp32 variance misses the fp32 tolerance on every row length, small
enough that an honest two-pass fp32 variance (sequential or lane-split sums) stays within it on
short rows; a larger offset would fail honest kernels on long rows too (docs/evaluator.md has the
margins)."""
_SET_KINDS = {"overflow": "exp", "zeros": "norm", "tiny": "norm", "offset": "norm", "special": None}


def _is_adversarial_target(spec: TensorSpec) -> bool:
    import torch

    return spec.role == "input" and getattr(torch, spec.dtype).is_floating_point


def _nonneg(spec: TensorSpec) -> bool:
    return spec.value_range is not None and spec.value_range[0] >= 0


def _rows(m: int, spec: TensorSpec, device="cpu"):
    """Row index of each of m flat elements (rows = the spec's last dimension, at least 1 long)."""
    import torch

    length = spec.shape[-1] if spec.shape and spec.shape[-1] > 0 else 1
    length = max(1, min(length, m))
    return torch.arange(m, device=device) // length, length


def _adversarial_flat(name: str, spec: TensorSpec, m: int, gen):
    """m float32 values (row-major, on ``gen``'s device) of set ``name`` for a floating input of
    ``spec``."""
    import torch

    dtype = getattr(torch, spec.dtype)
    nonneg = _nonneg(spec)
    dev = gen.device
    noise = torch.randn(m, generator=gen, device=dev)
    if name == "overflow":
        # rows cycle: centred near +90, near -90, spread over [-92, 92]; exp(x) overflows in fp32 and
        # bf16 above ~88.7, so an exponential without the max subtraction gives inf (then NaN)
        row, _ = _rows(m, spec, dev)
        kind = row % 3
        wide = torch.rand(m, generator=gen, device=dev) * 184 - 92
        c = OVERFLOW_CENTRE
        vals = torch.where(kind == 0, c + 1.5 * noise, torch.where(kind == 1, -c + 1.5 * noise, wide))
    elif name == "zeros":
        vals = noise.clone()
        vals[: m // 2] = 0.0
    elif name == "tiny":
        scale = 1e-4 if dtype == torch.float16 else 1e-12
        vals = noise * scale
        vals = torch.where(vals == 0, torch.full_like(vals, scale), vals)
    elif name == "offset":
        # one sign for the whole tensor: a mean over values of both signs would cancel, and eager's
        # own mean of such a group is then as uncertain as any kernel's
        sign = 1.0 if bool(torch.rand(1, generator=gen, device=dev).item() < 0.5) else -1.0
        vals = sign * OFFSET + noise
    elif name == "special":
        vals = noise.clone()
        plants = [float("nan"), float("inf")] + ([] if nonneg else [float("-inf")])
        plants = plants[: max(0, min(len(plants), m - 1))]
        if plants:
            length = max(1, min(spec.shape[-1] if spec.shape and spec.shape[-1] > 0 else 1, m))
            n_rows = (m - 1) // length + 1
            rows = [0, n_rows // 2, n_rows - 1]
            cols = [length // 3, length // 2, length - 1]
            used: set[int] = set()
            for k, v in enumerate(plants):
                pos = min(rows[k] * length + cols[k], m - 1)
                while pos in used:
                    pos = (pos + 1) % m
                used.add(pos)
                vals[pos] = v
    else:
        raise ValueError(f"unknown adversarial set {name!r}")
    if nonneg:
        vals = vals.abs()
    return vals


def adversarial_inputs(card: Card, device: str, seed: int) -> list[tuple[str, list]]:
    """Named input sets that break common approximations; each a full list of the card's inputs.

    Every tensor has the card's exact shape, strides (the layout ``random_tensor`` gives,
    overlapping expanded strides included) and dtype. Only floating-point tensors of role
    "input" get adversarial values; parameters, constants and integer/bool tensors get the
    ordinary draw-0 random values (value ranges respected). Sets, in this order, where they apply:

    * "overflow" (kind "exp"): rows near +90, near -90 and spread over [-92, 92] (a few units of
      spread): exp without the max subtraction overflows in fp32 and bf16.
    * "zeros" (kind "norm"): the first half of the elements (row-major) exactly 0, so whole rows
      and groups are zero; the rest normal.
    * "tiny" (kind "norm"): magnitudes ~1e-12 (~1e-4 for fp16) so x*x is far below any epsilon.
    * "offset" (kind "norm"): rows alternating around +OFFSET and -OFFSET (12) with unit noise: a
      one-pass E[x^2]-E[x]^2 variance in fp32 loses its precision (see OFFSET for why not 100).
    * "special" (any card with a floating input): normal values with a NaN, a +inf and a -inf in
      different rows (NaN and +inf only for non-negative inputs); never all elements.

    Inputs captured non-negative (value_range lower bound >= 0) stay non-negative in every set.
    The sets are deterministic for a given seed. Tensors whose layout overlaps itself get the
    pattern over the storage they reach.
    """
    import torch

    targets = [_is_adversarial_target(s) for s in card.inputs]
    if not any(targets):
        return []
    kinds = card_kinds(card)
    sets: list[tuple[str, list]] = []
    for k, name in enumerate(ADVERSARIAL_SETS):
        need = _SET_KINDS[name]
        if need is not None and need not in kinds:
            continue
        gen = torch.Generator(device).manual_seed((seed * 16 + k) & 0x7FFF_FFFF_FFFF_FFFF)
        tensors = []
        for spec, target in zip(card.inputs, targets):
            if not target:
                tensors.append(random_tensor(spec, device, gen, 0))
                continue
            dtype = getattr(torch, spec.dtype)
            n = storage_extent(spec.shape, spec.stride)
            overlapping = n < spec.numel
            m = n if overlapping else spec.numel
            vals = _adversarial_flat(name, spec, m, gen).to(dtype)
            if overlapping:
                tensors.append(vals.to(device).as_strided(spec.shape, spec.stride, 0))
            else:
                tensors.append(_as_layout(vals.reshape(spec.shape), spec, device))
        sets.append((name, tensors))
    return sets
