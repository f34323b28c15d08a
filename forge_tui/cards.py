"""Operator cards: one distinct operator call of a workload, with its cost and its reference.

A card is one distinct (target, input shapes, dtypes, strides, non-tensor arguments). Its
``program`` reproduces what eager computed (see program.py); its samples are captured real
inputs and outputs, stored by hash outside git (tensorstore.py).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
               "int64": "i64", "int32": "i32", "bool": "bool", "uint8": "u8", "int8": "i8"}


class CardKind(StrEnum):
    """What a card is, as the workspace's cards and the manifest spell it: a kernel's card (``OP``,
    ``MODULE``, ``CHAIN``) or a rewrite's (``FOLD``, ``EXPERTS``, ``MERGE``: ``forge_tui.rewrites``).
    A ``str`` enum: it equals, hashes and prints as its value, so JSON stays as it was."""

    OP = "op"
    """One aten call."""
    MODULE = "module"
    """A leaf module's forward."""
    CHAIN = "chain"
    """Ops a module's own forward calls one after another."""
    FOLD = "fold"
    """A batch norm folded into the convolution before it."""
    EXPERTS = "experts"
    """A routed mixture-of-experts block in one grouped pass."""
    MERGE = "merge"
    """Sibling linears on one input in one batched product."""


KERNEL_KINDS = (CardKind.OP, CardKind.MODULE, CardKind.CHAIN)
"""The kinds of card the profile makes and a kernel serves."""


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: list[int]
    stride: list[int]
    dtype: str
    role: Literal["input", "param", "const", "output"] = "input"
    name: str = ""
    value_range: tuple[float, float] | None = None
    """Smallest and largest finite value seen at capture (random inputs stay in a valid domain:
    indices in range, variances non-negative)."""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def contiguous(self) -> bool:
        expected, acc = [], 1
        for s in reversed(self.shape):
            expected.append(acc)
            acc *= s
        return all(sz <= 1 or st == e for sz, st, e in zip(self.shape, self.stride, reversed(expected)))

    def short(self) -> str:
        dims = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{dims} {DTYPE_SHORT.get(self.dtype, self.dtype)}"


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[str]
    outputs: list[str]
    point: dict[str, int] = {}
    """A range card's sample: the sizes of its ranged input dimensions (``ranges.at_sizes``)."""


class DimRange(BaseModel):
    """One dimension of a range card's tensor that varies from call to call (a decode step's KV
    length, a prompt's length, a batch): the sizes the profile saw, weighted by calls."""

    model_config = ConfigDict(extra="forbid")

    min: int
    max: int
    weights: dict[str, int] = {}
    """Calls per size seen (sizes as text, JSON's keys)."""
    same_as: str | None = None
    """Output dimensions: the input dimension (``"input1.dim2"``) whose size this one has at every
    call, which is how the runtime sizes an output for a call at any size of the range; None where
    none does (the card's kernel then cannot serve the range)."""

    def sizes(self) -> dict[int, int]:
        return {int(k): v for k, v in self.weights.items()}


class Coverage(BaseModel):
    """Which proposer covers a card, worked out once where the card is made
    (``templates.coverage.cover``) and stored on it, so that whatever shows the card only reads it."""

    model_config = ConfigDict(extra="forbid")

    proposer: Literal["template", "generator", "agent"]
    """The first proposer with a kernel for the card: a hand-written template family, the code
    generator, or the LLM agent alone."""
    family: str | None = None
    """The family whose kernels serve the card (``generated`` for the generator); None for the agent."""
    why_not: str | None = None
    """Where only the agent covers the card: why neither a template family nor the generator does
    (the op, the access pattern, or no valid configuration for the shape)."""


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal[CardKind.OP, CardKind.MODULE, CardKind.CHAIN]
    target: str
    """'aten._softmax.default' for ops; 'module:RMSNorm' for leaf modules; 'chain:mul+add+_softmax'
    for a chain of ops a module's own forward calls one after another."""
    label: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    program: dict[str, Any]
    module_paths: list[str] = []
    within: list[str] = []
    """Op cards: the module or chain cards whose forwards (or chains) made every call of this one
    (it is nested in them: their kernels serve it); empty when some call was made elsewhere."""
    call_args: Any = None
    """Module cards: the forward's arguments, tensors replaced by {"$t": k} (None: not recorded)."""
    module_attrs: dict[str, dict[str, Any]] = {}
    """Module cards: each module's plain attributes (eps, scale, the training flag) at its first
    profiled call, by module path (``runtime.attrs.recorded_attrs``): the runtime serves a module
    only while its attributes are these."""
    returns: str = "tensor"
    """Module cards: "tensor" or "tuple", how the forward returns its outputs ("other": neither)."""
    scope_keys: list[str] = []
    """Op and chain cards: the profiled calls of the module whose own forward made this card's
    calls, by key (``runtime.graph.key_text``): a compiled scope compiles a variant for such a
    call whatever it met before (``VariantBook.profiled``)."""
    flags: list[str] = []
    """'mutates' (in-place op; the card is its functional form), 'dynamic_shape' (output shape
    depends on data), 'no_sample' (inputs too large to keep; timing used random inputs)."""
    ranges: dict[str, DimRange] = {}
    """A range card's varying dimensions, by ``"input0.dim2"`` / ``"output0.dim2"`` (``ranges.py``):
    its calls differ only in these, each inside its range; ``inputs``, ``outputs`` and ``program``
    are those of its most weighted size. Empty for an exact-shape card."""
    phases: dict[str, int] = {}
    """Calls per generation phase (``"prefill"``, ``"decode"``) in a profile of a generation."""
    phase_share: dict[str, float] = {}
    """The share of the generation each phase's calls take (``share`` is their sum)."""
    calls: int = 0
    time_us: float | None = None
    time_spread: float | None = None
    share: float | None = None
    bytes: int = 0
    flops: int = 0
    floor_us: float | None = None
    headroom: float | None = None
    samples: list[Sample] = []
    device: str = "cpu"
    dtype: str = "float32"
    coverage: Coverage | None = None
    """Which proposer covers the card (None: not worked out, a card from before the field; the
    workspace works it out when it loads such a card)."""

    @property
    def total_us(self) -> float:
        return (self.time_us or 0.0) * self.calls

    @property
    def op_name(self) -> str:
        """'_softmax' for 'aten._softmax.default'; 'RMSNorm' for 'module:RMSNorm'."""
        if self.kind in (CardKind.MODULE, CardKind.CHAIN):
            return self.target.split(":", 1)[1]
        parts = self.target.split(".")
        return parts[1] if len(parts) > 1 else self.target

    def shapes(self) -> str:
        """The inputs' shapes and dtypes; a ranged dimension as its range (``1..16``)."""
        out = []
        for k, s in enumerate(self.inputs):
            if s.role not in ("input", "param"):
                continue
            text = s.short()
            if self.ranges:
                dims = [f"{r.min}..{r.max}" if (r := self.ranges.get(f"input{k}.dim{d}")) else str(n)
                        for d, n in enumerate(s.shape)]
                text = "x".join(dims) + " " + text.split(" ", 1)[1]
            out.append(text)
        return ", ".join(out) or "-"


IN_PLACE = "in-place ops are not served"


def not_served(kind: str, flags: list[str]) -> str | None:
    """Why the runtime never serves a card of this kind with these flags, None where it may: an op
    or a chain that changes its inputs in place (its kernel writes new outputs; the model reads
    the input it changed). The one rule for the runtime, the search (which does not search such a
    card) and the op table's share of the forward served."""
    if kind != CardKind.MODULE and "mutates" in flags:
        return IN_PLACE
    return None


def id_matches(card_id: str, prefix: str) -> bool:
    """Whether a user's card reference (an id or its start, leading underscores optional) names ``card_id``."""
    return card_id.lstrip("_").startswith(prefix.lstrip("_"))


OPTIONAL_FIELDS = ("ranges", "phases", "phase_share")
"""Fields written only where set: an exact-shape card of a forward's profile reads as it did
before generations were profiled."""


def card_json(card: Card) -> dict[str, Any]:
    data = card.model_dump(mode="json")
    for k in OPTIONAL_FIELDS:
        if not data.get(k):
            data.pop(k, None)
    for sample in data.get("samples", []):
        if not sample.get("point"):
            sample.pop("point", None)
    return data


def save_cards(cards: list[Card], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for card in cards:
        (folder / f"{card.id}.json").write_text(json.dumps(card_json(card), indent=1) + "\n")


def load_cards(folder: Path) -> list[Card]:
    cards = [Card.model_validate_json(p.read_text()) for p in sorted(folder.glob("*.json"))]
    cards.sort(key=lambda c: (-(c.share or 0.0), c.id))
    return cards
