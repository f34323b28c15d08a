"""The manifest of promoted kernels: what the runtime puts into a model, and why it may.

It lives on the workspace's ``main`` branch as ``kernels/manifest.json``, beside each kernel's
source (``kernels/<card>/kernel.cu|cpp``) and its builds (``kernels/<card>/<arch>.so``); an export
carries the same files with their checksums. One entry per card: the card's signature (what a
call must look like for the kernel to serve it), the source, a build per backend/arch, the
evidence the approval rested on, and who or what approved it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..cards import Card, CardKind, DimRange, TensorSpec
from ..errors import ForgeError

MANIFEST_VERSION = 1
KERNELS_DIR = "kernels"
MANIFEST_NAME = "manifest.json"


class Signature(BaseModel):
    """What a call must be for the kernel to serve it: the card's target, its tensors (shape,
    strides, dtype) and its program (which fixes every scalar argument)."""

    model_config = ConfigDict(extra="forbid")

    card: str
    kind: CardKind
    """A kernel's card (op, module, chain) or a rewrite's: fold, a batch norm folded into the
    convolution before it (``runtime/fold.py``); experts, a routed mixture-of-experts block in one
    grouped pass (``runtime/experts.py``); merge, sibling linears on one input in one batched
    product (``runtime/merge.py``)."""
    target: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    program: dict[str, Any]
    module_paths: list[str] = Field(default_factory=list)
    call_args: Any = None
    """Module cards: the forward's recorded arguments, tensors as {"$t": k}."""
    module_attrs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Module cards: each module's plain attributes at its profiled call, by module path
    (``Card.module_attrs``): a served call's module must have them (``runtime/attrs.py``)."""
    returns: str = "tensor"
    flags: list[str] = Field(default_factory=list)
    scope_keys: list[str] = Field(default_factory=list)
    """Op and chain cards: the profiled calls of the module that made the card's calls (``Card``)."""
    ranges: dict[str, DimRange] = Field(default_factory=dict)
    """A range card's varying dimensions (``Card.ranges``): the guard matches a call by its shape
    class (``forge_tui.ranges.fits``), the kernel sizes its outputs from them."""

    @classmethod
    def of(cls, card: Card) -> "Signature":
        return cls(card=card.id, kind=card.kind, target=card.target, inputs=card.inputs, outputs=card.outputs,
                   program=card.program, module_paths=card.module_paths, call_args=card.call_args,
                   module_attrs=card.module_attrs,
                   returns=card.returns, flags=card.flags, scope_keys=card.scope_keys, ranges=card.ranges)

    def digest(self) -> str:
        """The signature's hash (an exact-shape card's as before ranges existed)."""
        return hashlib.sha256(self.model_dump_json(exclude={"ranges"} if not self.ranges else None).encode()).hexdigest()[:16]


class Build(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["cpu", "cuda"]
    arch: str
    """sm_90 and the like on CUDA; the machine's ``uname -m`` on the CPU (built -march=native)."""
    path: str
    """Relative to the manifest's folder."""
    sha256: str


class Evidence(BaseModel):
    """What the approval rested on, copied from the node's evaluation."""

    model_config = ConfigDict(extra="allow")

    node: str
    commit: str
    parent: str | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_eager_q1: float | None = None
    speedup_vs_eager_q3: float | None = None
    speedup_vs_compile: float | None = None
    compile_basis: str | None = None
    """"device": ``speedup_vs_compile`` divides torch.compile's kernels' device time (what the
    evaluator measures on cuda); "latency" or none (entries from before the evaluator measured
    device time, and the cpu backend): its call's, guards included."""
    spread: float | None = None
    time_us: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    compile_device_us: float | None = None
    input_sets: list[str] = Field(default_factory=list)
    fraction_of_floor: float | None = None
    profile: dict[str, Any] | None = None
    diff: str = ""


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    card: str
    signature: Signature
    source: str
    """Relative path of the kernel's source."""
    source_sha256: str
    builds: list[Build] = Field(default_factory=list)
    evidence: Evidence
    approved_by: str
    approved_at: str
    enabled: bool = True
    disabled_reason: str = ""
    """Why the kernel is off (set by ``forge bench`` when it made the whole forward slower)."""
    compile_disabled_reason: str = ""
    """Why the kernel is off in torch.compile'd models (``Mode.TORCH_COMPILE``; set by ``forge
    bench`` when the compiled forward ran slower with forge's kernels than without). Only this
    verdict counts there, as ``graph_disabled_reason`` does in CUDA graphs."""
    graph_disabled_reason: str = ""
    """Why the kernel is off in models captured in CUDA graphs (``Mode.CUDA_GRAPH``; set by
    ``forge bench --graphs`` when the graphed forward ran slower with it). Only this verdict counts
    there: ``enabled`` is the op-by-op forward's, where the host's cost of each call decides."""


class Rejection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    card: str
    node: str
    by: str
    at: str
    reason: str = ""


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = MANIFEST_VERSION
    entries: dict[str, Entry] = Field(default_factory=dict)
    rejected: list[Rejection] = Field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> "Manifest":
        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            return cls()
        try:
            return cls.model_validate_json(path.read_text())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "the file"
            raise ForgeError(f"{path} is damaged ({exc.error_count()} error(s); first at {where}: {err['msg']}); "
                             "restore it (in a workspace: git checkout main -- kernels/; an export: export it again)") from None

    def save(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
        return path

    def rejected_nodes(self, card: str) -> set[str]:
        return {r.node for r in self.rejected if r.card == card}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
