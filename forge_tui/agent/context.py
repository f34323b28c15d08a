"""What the agent is told: prompt templates (text files in ``prompts/``) filled from a card and the
search's state, and the files put in the conversation's working directory.

The templates live in the repository's top-level ``prompts/`` folder; a wheel installs them as
``forge_tui/prompts/`` (data of ``forge_tui``: setup.py maps the folder there), while an editable
install or a source checkout reads the folder where it is.

Templates use ``$name`` placeholders (``string.Template``); a placeholder with no value is an
error, so a template and this module cannot drift apart silently.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template
from typing import Any

from ..cards import Card
from ..errors import ForgeError
from ..evaluator.report import format_result
from ..kernel_abi import HEADER, SOURCE_NAMES, card_scalars
from ..search.proposer import NodeView, ProposalContext

EXT = {backend: Path(name).suffix for backend, name in SOURCE_NAMES.items()}
"""The suffix of the sources the agent is shown (parent, best, siblings, template), as its candidate's."""
LANGUAGE = {"cuda": "CUDA C++, built with nvcc", "cpu": "C++17 with OpenMP, built with g++ -O3 -march=native"}


CHECKOUT_PROMPTS = Path(__file__).resolve().parents[2] / "prompts"
"""The repository's ``prompts/`` folder, beside ``forge_tui/`` in a source checkout."""


@functools.cache
def prompts_dir() -> Traversable:
    """The folder of prompt templates: ``forge_tui/prompts/`` where a wheel installed it, else the
    source checkout's ``prompts/``; ForgeError when neither holds them."""
    installed = resources.files("forge_tui").joinpath("prompts")
    for where in (installed, CHECKOUT_PROMPTS):
        if where.joinpath("system.md").is_file():
            return where
    raise ForgeError(f"the agent's prompt templates are missing: neither {installed} nor {CHECKOUT_PROMPTS} "
                     "holds system.md (reinstall forge-tui)")


def prompt_text(name: str) -> str:
    """A file of the prompt templates (``system.md``, ``notes/cuda.md``)."""
    return prompts_dir().joinpath(*name.split("/")).read_text()


def render(name: str, **values: Any) -> str:
    return Template(prompt_text(name)).substitute({k: str(v) for k, v in values.items()})


def card_summary(card: Card) -> str:
    lines = [f"{card.label}: {card.target} ({card.kind} card), {card.calls} call(s) per forward"]
    if card.time_us is not None:
        lines.append(f"eager time {card.time_us:.2f} µs per call, {100 * (card.share or 0):.1f}% of the forward")
    if card.floor_us:
        lines.append(f"roofline floor {card.floor_us:.2f} µs (headroom {card.headroom or 0:.1f}x); "
                     f"{card.bytes} bytes moved, {card.flops} flops")
    for title, specs in (("inputs", card.inputs), ("outputs", card.outputs)):
        lines.append(f"{title}:")
        for k, s in enumerate(specs):
            name = f" {s.name}" if s.name else ""
            rng = f", values in [{s.value_range[0]:.3g}, {s.value_range[1]:.3g}]" if s.value_range else ""
            lines.append(f"  [{k}]{name} {s.role} {s.dtype} shape {s.shape} stride {s.stride}"
                         f"{' (contiguous)' if s.contiguous else ' (NOT contiguous)'}{rng}")
    scalars = card_scalars(card.program)
    if scalars:
        lines.append("scalars (in order): " + ", ".join(f"[{k}] {s.name} = {s.value!r}" for k, s in enumerate(scalars)))
    if card.flags:
        lines.append("flags: " + ", ".join(card.flags))
    return "\n".join(lines)


def machine_summary(backend: str, profile: dict[str, Any], gpu: Any | None) -> str:
    ceil = profile.get("ceilings") or {}
    bw = ceil.get("bandwidth_Bps")
    lines = [f"backend {backend}: {LANGUAGE.get(backend, backend)}"]
    if backend == "cuda" and gpu is not None:
        lines.append(f"GPU {gpu.name}: {gpu.sms} SMs, compute capability {gpu.capability[0]}.{gpu.capability[1]}, "
                     f"{gpu.smem_per_block // 1024} KiB shared memory per block (opt-in), "
                     f"{gpu.smem_per_sm // 1024} KiB per SM, L2 {gpu.l2_bytes // (1024 * 1024)} MiB, "
                     f"{gpu.max_threads_per_sm} threads per SM")
    elif profile.get("device_name"):
        lines.append(f"device {profile['device_name']}")
    if bw:
        lines.append(f"measured copy bandwidth {bw / 1e9:.0f} GB/s" +
                     ("" if backend == "cuda" else " (DRAM; caches are faster for small buffers)"))
    peaks = ceil.get("peak_flops") or {}
    if peaks:
        lines.append("measured matmul peak: " + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in peaks.items()))
    return "\n".join(lines)


def _speed(v: NodeView) -> str:
    return f"{v.speedup:.3f}x eager" if v.speedup else v.status


def lineage_summary(ctx: ProposalContext) -> str:
    lines = []
    if ctx.best is not None:
        lines.append(f"best so far: {ctx.best.id}, {_speed(ctx.best)}: {ctx.best.move}")
    else:
        lines.append("no kernel has passed yet on this card")
    path = " -> ".join(f"{v.id} ({_speed(v)})" for v in ctx.lineage)
    lines.append(f"the node you extend and its ancestors: {path}")
    for title, views in (("recent improvements", ctx.improvements), ("recent regressions", ctx.regressions)):
        if views:
            lines.append(f"{title}: " + "; ".join(f"{v.id} {_speed(v)}: {v.move}" for v in views))
    if ctx.children:
        lines.append("children this node already has (do not repeat them): " +
                     "; ".join(f"{v.id} {_speed(v)}: {v.move}" for v in ctx.children))
    return "\n".join(lines)


@dataclass
class Prepared:
    """The working directory of one conversation, filled."""

    files: list[str]
    read_only: set[str]
    parent_section: str
    siblings_section: str
    template_section: str


def prepare_workdir(workdir: Path, ctx: ProposalContext, template_source: str | None) -> Prepared:
    """Write the conversation's context files; the candidate starts as the parent's source."""
    ext = EXT.get(ctx.backend, ".cu")
    workdir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {
        "card.json": json.dumps(ctx.card.model_dump(mode="json", exclude={"samples"}), indent=1),
        "reference.py": ctx.reference_source or "# (the reference could not be read)\n",
    }
    shutil.copyfile(HEADER, workdir / "forge_kernel.h")
    parent_section = "# The node you extend\nThe root: eager PyTorch. Write the first kernel for this card."
    candidate = ""
    if ctx.parent.id != "root" and ctx.parent.source:
        files[f"parent{ext}"] = ctx.parent.source
        candidate = ctx.parent.source
        parent_section = (f"# The node you extend\n{ctx.parent.id}: {_speed(ctx.parent)}: {ctx.parent.move}\n"
                          f"Its source is `parent{ext}` (your `candidate{ext}` starts as a copy of it).")
        if ctx.parent.result is not None:
            files["parent_result.txt"] = format_result(ctx.parent.result)
            parent_section += "\nIts evaluation (`parent_result.txt`):\n" + files["parent_result.txt"]
    if ctx.best is not None and ctx.best.id != ctx.parent.id and ctx.best.source:
        files[f"best{ext}"] = ctx.best.source
    sib_lines = []
    for v in ctx.failed_siblings[:6]:
        if v.source:
            files[f"siblings/{v.id}{ext}"] = v.source
        why = v.reason or (v.result.reason if v.result is not None else "")
        files[f"siblings/{v.id}.txt"] = format_result(v.result) if v.result is not None else why
        sib_lines.append(f"- {v.id} ({v.status}): {v.move}: {why[:300]}")
    siblings_section = ("# Attempts from this node that failed (learn from them)\n" + "\n".join(sib_lines)
                        if sib_lines else "")
    template_section = ""
    if template_source:
        files[f"template{ext}"] = template_source
        template_section = (f"# The template library's kernel for this card\n`template{ext}` is what forge's "
                            "built-in templates write for this card (evaluated or not): a strong starting point.")
    notes = "cuda.md" if ctx.backend == "cuda" else "cpu.md"
    files[f"notes/{notes}"] = prompt_text(f"notes/{notes}")
    for name, text in files.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    candidate_name = SOURCE_NAMES.get(ctx.backend, SOURCE_NAMES["cuda"])
    (workdir / candidate_name).write_text(candidate)
    names = sorted([*files, "forge_kernel.h", candidate_name])
    return Prepared(files=names, read_only=set(files) | {"forge_kernel.h"}, parent_section=parent_section,
                    siblings_section=siblings_section, template_section=template_section)
