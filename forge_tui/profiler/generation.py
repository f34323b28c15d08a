"""Profiling a generation: the prefill and every decode step, their calls grouped into range cards.

``forge profile WORKLOAD --generate N`` runs the workload's ``generate(model, inputs)`` with N new
tokens (a Hugging Face model without one: greedy ``model.generate``). Each call of the generating
module's forward is a phase: the first of a generation its prefill, the later ones its decode
steps (``PhaseMarker``). Calls that differ only in dimensions that vary from step to step (a KV
length, a prompt's length, a batch) are grouped into one range card (``group_buckets``,
``forge_tui.ranges``): what the buckets of one group share is their kind, target, program (but the
sizes it records), their tensors' dtypes, roles and ranks, their parameters' and constants' shapes,
a layout class per tensor, and a module they were made in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ..cards import DimRange
from ..errors import WorkloadError
from ..ranges import dim_key, same_class
from .capture import Bucket

PREFILL, DECODE = "prefill", "decode"


class PhaseMarker:
    """Sets ``recorder.phase`` from the generating module's forward calls: the first call after
    ``start`` is the prefill, every later one a decode step."""

    def __init__(self, module: Any, recorder: Any) -> None:
        self.recorder = recorder
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        self.recorder.phase = PREFILL if self.calls == 0 else DECODE
        self.calls += 1

    def start(self) -> None:
        """A new generation begins: its next forward call is a prefill."""
        self.calls = 0

    def remove(self) -> None:
        self.handle.remove()
        self.recorder.phase = None


def generation_runner(workload: Any, model: Any, inputs: list[Any], new_tokens: int) -> Callable[[], Any]:
    """The workload's generation of ``new_tokens`` tokens as a call: its ``generate(model, inputs)``
    (given ``max_new_tokens``), else a Hugging Face model's greedy ``generate``. A workload that
    has neither is refused with one line."""
    gen = getattr(workload.module, "generate", None)
    if callable(gen):
        return lambda: gen(model, inputs, max_new_tokens=new_tokens)
    from ..errors import ForgeError
    from ..generation.adapters import _is_hf, generating_module

    try:
        inner = generating_module(model)
    except ForgeError:
        inner = None
    if inner is None or not _is_hf(inner):
        raise WorkloadError(f"{workload.path.name}: --generate needs a generate(model, inputs) function in the "
                            "workload, or a Hugging Face model that generates; this one has neither")
    ids = inputs[0]
    hf: Any = inner
    return lambda: hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def generating_module_of(model: Any) -> Any:
    """The module whose forward calls are the generation's steps."""
    from ..generation.adapters import generating_module

    try:
        return generating_module(model)
    except Exception:  # noqa: BLE001 - a model the adapters do not know: its own forward
        return model


@dataclass
class Group:
    """Buckets that become one card: ``rep`` the most weighted, ``ranges`` their varying dims."""

    buckets: list[Bucket]
    ranges: dict[str, DimRange] = field(default_factory=dict)

    @property
    def rep(self) -> Bucket:
        return self.buckets[0]

    @property
    def calls(self) -> int:
        return sum(b.calls for b in self.buckets)

    def ends(self) -> list[Bucket]:
        """The buckets at the range's ends: the fewest and the most elements, not ``rep``."""
        if len(self.buckets) < 2:
            return []
        by_size = sorted(self.buckets, key=lambda b: (sum(s.numel for s in b.inputs), b.first_seen))
        out: list[Bucket] = []
        for b in (by_size[0], by_size[-1]):
            if b is not self.rep and b not in out:
                out.append(b)
        return out

    def point(self, b: Bucket) -> dict[str, int]:
        """Bucket ``b``'s sizes of the ranged input dimensions."""
        out = {}
        for key in self.ranges:
            if key.startswith("input"):
                k, d = key.removeprefix("input").split(".dim")
                out[key] = b.inputs[int(k)].shape[int(d)]
        return out


def _program_class(program: dict) -> str:
    """A program's text with the sizes its nodes record left out (their ranks kept)."""
    nodes = [{**n, "out": [[len(m[0]), m[1]] if m is not None else None for m in n["out"]]} if "out" in n else n
             for n in program.get("nodes", [])]
    return json.dumps({**program, "nodes": nodes}, sort_keys=True)


def _class_key(b: Bucket) -> str:
    fixed = [[s.role, s.dtype, len(s.shape), s.shape if s.role != "input" else None] for s in b.inputs]
    outs = [[s.dtype, len(s.shape)] for s in b.outputs]
    return json.dumps([b.kind, b.target, _program_class(b.program), fixed, outs, sorted(b.flags - {"direct"})])


def group_buckets(buckets: list[Bucket]) -> list[Group]:
    """The buckets grouped into cards: those alike but for the sizes of their input tensors'
    dimensions, made in a module they share, each tensor of one layout class (``same_class``), one
    group; every other bucket a group of its own. Groups come in the order of their first call."""
    classes: dict[str, list[list[Bucket]]] = {}
    for b in sorted(buckets, key=lambda b: b.first_seen):
        lists = classes.setdefault(_class_key(b), [])
        for members in lists:
            if _joins(b, members):
                members.append(b)
                break
        else:
            lists.append([b])
    groups = []
    for lists in classes.values():
        for members in lists:
            members.sort(key=lambda b: (-b.calls, b.first_seen))
            g = Group(members)
            g.ranges = _ranges(members)
            groups.append(g)
    groups.sort(key=lambda g: min(b.first_seen for b in g.buckets))
    return groups


def _joins(b: Bucket, members: list[Bucket]) -> bool:
    first = members[0]
    if b.module_paths and first.module_paths and not set(b.module_paths) & {p for m in members for p in m.module_paths}:
        return False
    return all(same_class(x, y) for x, y in zip(b.inputs, first.inputs)) and \
        all(same_class(x, y) for x, y in zip(b.outputs, first.outputs))


def _ranges(members: list[Bucket]) -> dict[str, DimRange]:
    """The dimensions whose sizes differ among ``members``, with their sizes weighted by calls;
    each varying output dimension linked to the input dimension whose size it has in every bucket
    (``DimRange.same_as``)."""
    if len(members) < 2:
        return {}
    out: dict[str, DimRange] = {}
    varying_inputs: list[tuple[int, int]] = []
    for io, specs_of in (("input", lambda b: b.inputs), ("output", lambda b: b.outputs)):
        for k, spec in enumerate(specs_of(members[0])):
            for d in range(len(spec.shape)):
                sizes = [specs_of(b)[k].shape[d] for b in members]
                if len(set(sizes)) < 2:
                    continue
                weights: dict[str, int] = {}
                for b, n in zip(members, sizes):
                    weights[str(n)] = weights.get(str(n), 0) + b.calls
                r = DimRange(min=min(sizes), max=max(sizes), weights=weights)
                if io == "input":
                    varying_inputs.append((k, d))
                else:
                    r.same_as = next((dim_key("input", i, di) for i, di in varying_inputs
                                      if all(b.inputs[i].shape[di] == b.outputs[k].shape[d] for b in members)), None)
                out[dim_key(io, k, d)] = r
    return out
