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
        return ", ".join(s.short() for s in self.inputs if s.role in ("input", "param")) or "-"


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


def save_cards(cards: list[Card], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for card in cards:
        (folder / f"{card.id}.json").write_text(json.dumps(card.model_dump(mode="json"), indent=1) + "\n")


def load_cards(folder: Path) -> list[Card]:
    cards = [Card.model_validate_json(p.read_text()) for p in sorted(folder.glob("*.json"))]
    cards.sort(key=lambda c: (-(c.share or 0.0), c.id))
    return cards
