"""Comparing outputs: tolerances by dtype, NaN/Inf exactly where the reference has them.

A mismatch names its first few bad elements (index, got, expected): what a person, or the agent,
needs to see what a wrong kernel does wrong (a NaN row, an off-by-one column, a constant factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# (rtol, atol) per dtype: fp32 near 1e-5 relative, half precision near 1e-2. atol is relative to
# the scale of the reference (its RMS) when a scale is given, so tiny outputs are not free passes.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-5, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1.6e-2, 1.6e-2),
}


def tolerance(dtype_name: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype_name, (0.0, 0.0))


FIRST_BAD = 5
"""How many bad elements a mismatch names."""


def _value(v: float | int | bool) -> str:
    return f"{v:.8g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class BadElement:
    """One element outside tolerance: where (the index into the output), what the candidate wrote,
    what the reference holds."""

    index: tuple[int, ...]
    got: float | int | bool
    expected: float | int | bool

    def __str__(self) -> str:
        return f"[{', '.join(map(str, self.index))}] got {_value(self.got)} expected {_value(self.expected)}"

    def to_json(self) -> dict:
        return {"index": list(self.index), "got": self.got, "expected": self.expected}


@dataclass
class Mismatch:
    index: int  # which output
    reason: str
    max_abs_err: float = 0.0
    bad_fraction: float = 0.0
    first: list[BadElement] = field(default_factory=list)
    """The first bad elements in row-major order (up to FIRST_BAD); none for a shape or dtype mismatch."""

    def __str__(self) -> str:
        text = f"output {self.index}: {self.reason}"
        if self.first:
            text += "; first bad elements: " + ", ".join(map(str, self.first))
        return text


def first_bad(bad, actual, expected, limit: int = FIRST_BAD) -> list[BadElement]:
    """The first ``limit`` positions where ``bad`` (a bool tensor shaped like both) is set, with
    the values there. Scanned in chunks, so a huge output costs no index array of its size."""
    flat = bad.reshape(-1)
    found: list[int] = []
    step = 1 << 22
    for start in range(0, flat.numel(), step):
        hits = flat[start:start + step].nonzero()[:limit - len(found)].reshape(-1).tolist()
        found.extend(start + int(h) for h in hits)
        if len(found) >= limit:
            break
    out = []
    for pos in found:
        idx = []
        for size in reversed(bad.shape):
            idx.append(pos % size)
            pos //= size
        i = tuple(reversed(idx))
        out.append(BadElement(i, actual[i].item(), expected[i].item()))
    return out


def compare(actual, expected, index: int = 0, rtol: float | None = None, atol: float | None = None,
            scale=None, nonfinite: str = "exact") -> Mismatch | None:
    """None when ``actual`` matches ``expected``; else what is wrong.

    Floats: |a - e| <= atol * s + rtol * |e| elementwise, where s is ``scale`` (the typical size
    of the reference's values, default 1). Non-finite values must match exactly in position and
    kind (``nonfinite="exact"``), or, with ``nonfinite="position"``, be non-finite exactly where
    the reference is (which of NaN and ±inf an op gives for an infinite input is an accident of
    its implementation: eager's own gelu(+inf) is inf or NaN depending on the tensor's length).
    Integers and bools: exact.
    """
    import torch

    name = str(expected.dtype).removeprefix("torch.")
    if actual.shape != expected.shape:
        return Mismatch(index, f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Mismatch(index, f"dtype {actual.dtype} != expected {expected.dtype}")
    if not expected.is_floating_point():
        bad = (actual != expected)
        n = int(bad.sum())
        if n:
            return Mismatch(index, f"{n} of {bad.numel()} elements differ", bad_fraction=n / bad.numel(),
                            first=first_bad(bad, actual, expected))
        return None
    r, a = tolerance(name)
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    act = actual.double()
    exp = expected.double()
    fin_e = torch.isfinite(exp)
    if nonfinite == "position":
        fin_a = torch.isfinite(act)
        if not torch.equal(fin_e, fin_a):
            wrong = fin_e != fin_a
            n = int(wrong.sum())
            return Mismatch(index, f"non-finite (NaN or inf) where the reference is finite, or finite where it is not "
                            f"({n} elements)", bad_fraction=n / max(exp.numel(), 1),
                            first=first_bad(wrong, actual, expected))
        act = torch.where(fin_e, act, torch.zeros_like(act))
        exp = torch.where(fin_e, exp, torch.zeros_like(exp))
    nan_e, nan_a = torch.isnan(exp), torch.isnan(act)
    if not torch.equal(nan_e, nan_a):
        wrong = nan_e != nan_a
        n = int(wrong.sum())
        return Mismatch(index, f"NaN where the reference has none, or missing NaN ({n} elements)",
                        bad_fraction=n / max(exp.numel(), 1), first=first_bad(wrong, actual, expected))
    inf_e = torch.isinf(exp)
    if not torch.equal(inf_e, torch.isinf(act)) or not torch.equal(exp[inf_e], act[inf_e]):
        wrong = (inf_e != torch.isinf(act)) | (inf_e & (exp != act))
        n = int(wrong.sum())
        return Mismatch(index, "Inf where the reference has none, or of the wrong sign", bad_fraction=n / max(exp.numel(), 1),
                        first=first_bad(wrong, actual, expected))
    if exp.numel() == 0:
        return None
    s = 1.0 if scale is None else float(scale)
    err = (act - exp).abs()
    err = torch.where(fin_e, err, torch.zeros_like(err))
    bad = err > (atol * s + rtol * exp.abs())
    n = int(bad.sum())
    if n:
        return Mismatch(index, f"{n} of {bad.numel()} elements outside tolerance (max abs error {float(err.max()):.3g}, "
                        f"rtol {rtol:g}, atol {atol * s:.3g})", max_abs_err=float(err.max()), bad_fraction=n / bad.numel(),
                        first=first_bad(bad, actual, expected))
    return None
