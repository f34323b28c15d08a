"""``forge experts WORKLOAD -w WS``: the workload's routed mixture-of-experts blocks computed in one
grouped pass each, as experts cards promoted to the workspace's manifest.

Its other half is the runtime's: ``forge_tui/runtime/experts.py`` says what the grouped pass is,
finds the blocks and serves an experts card in a model, and ``forge_tui/runtime/kinds/experts.py``
installs the cards; this module proposes, checks, times and promotes them.

The model runs once on the workload's inputs with a hook on each block found
(``runtime.experts.find_blocks``); blocks whose calls look alike (their structure, activation and
the input's shape, strides and dtype) make one experts card. Each card is checked on its first
call's captured input and on a random input of the same spec (the grouped pass against the
block's own forward, within the evaluator's tolerance), with the top-k weights renormalised or
not as the block's ``norm_topk_prob`` says, else as its output shows; then both are timed
interleaved with the evaluator's timer. A card that matches and is faster is promoted: its
evidence (speedup with spread, the input sets), its configuration (``kernels/<card>/experts.json``)
committed to ``main`` with who approved it; running the command is the approval, as
``forge approve`` is for kernels.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..cards import CardKind
from ..runtime.experts import EXPERTS_FILE, Block, Stacked, card_id, check, find_blocks, returns_of, routed, target
from ..runtime.manifest import Entry
from ..timing import Stats, Timer, paired_ratio
from .base import Rewrite, RewriteCard, promote_cards, random_like, rewrite_line, run_rewrite, run_with_pre_hooks, speed_refusal, tensor_spec


@dataclass
class ExpertsCard(RewriteCard):
    blocks: list[str] = field(default_factory=list)
    grouped: Stats | None = None
    compiled: Stats | None = None
    """torch.compile's code for the block (``dynamic=False``), timed interleaved with the two others
    where asked (``propose``'s ``vs_compile``)."""
    vs_compile: Stats | None = None
    """The paired ratio of torch.compile's block over the grouped pass: the kernel's isolated ratio
    over inductor's own code for the card."""
    compile_note: str = ""
    """Why torch.compile's block was not timed, where it was asked for."""

    kind: ClassVar[CardKind] = CardKind.EXPERTS
    file: ClassVar[str] = EXPERTS_FILE
    timed_as: ClassVar[tuple[str, str]] = ("block_us", "grouped_us")

    def after(self) -> Stats | None:
        return self.grouped

    def sites(self) -> list[str]:
        return list(self.blocks)

    def config(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "share": self.share}

    def returns(self) -> str:
        return str(self.program["returns"])

    def line(self) -> str:
        line = rewrite_line(self, len(self.blocks), "block", "not served", "the block's own forward", self.grouped)
        if self.refused:
            return line
        if self.vs_compile is not None and self.compiled is not None:
            v = self.vs_compile
            return line + (f"; {v.median:.2f}x [{v.q1:.2f}, {v.q3:.2f}] torch.compile's block "
                           f"({self.compiled.median:.1f} µs)")
        return line + (f"; torch.compile's block not timed: {self.compile_note}" if self.compile_note else "")

    def site_json(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "share": self.share,
                "vs_compile": self.vs_compile.to_json() if self.vs_compile else None,
                "compiled_us": self.compiled.median if self.compiled else None,
                "compile_note": self.compile_note or None}


def _compiled_block(m: Any, x: Any) -> tuple[Any, str]:
    """(torch.compile of block ``m``, compiled by a first call on ``x``, or None; why not)."""
    import torch

    try:
        compiled = torch.compile(m, dynamic=False)
        with torch.no_grad():
            compiled(x)
        return compiled, ""
    except Exception as exc:  # noqa: BLE001 - the comparison is left out, said why
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def propose(model: Any, inputs: list[Any], run: Any, device: str, *, repeats: int = 20,
            min_speedup: float | None = None, vs_compile: bool | None = None
            ) -> tuple[list[ExpertsCard], dict[str, str]]:
    """The experts cards of ``model`` (in eval mode) on ``inputs``, each checked and timed; and why
    the modules that look like routed-experts blocks are not served. ``vs_compile`` (default: on
    cuda) times torch.compile's code for each block too, interleaved with the block's own
    forward and the grouped pass: what the runtime weighs the card by under torch.compile."""
    import torch

    if vs_compile is None:
        vs_compile = device == "cuda"

    blocks, why = find_blocks(model)
    by_id: dict[int, Block] = {id(model.get_submodule(b.path)): b for b in blocks}
    cards: dict[str, ExpertsCard] = {}
    captured: dict[str, tuple[Any, Block, Any]] = {}
    calls: dict[str, int] = {}

    def pre_hook(m: Any, args: tuple, kwargs: dict) -> None:
        b = by_id.get(id(m))
        if b is None:
            return
        if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
            why[b.path] = "called with other arguments than the hidden states"
            return
        x = args[0]
        spec = tensor_spec(x, "input")
        key = json.dumps({"block": b.program(False, "")} | {"input": spec.model_dump()}, sort_keys=True)
        calls[b.path] = calls.get(b.path, 0) + 1
        if key not in captured:
            captured[key] = (m, b, x.detach().clone())
            cards[key] = ExpertsCard("", target(b), spec, tensor_spec(torch.empty(0), "output"), {})
        if b.path not in cards[key].blocks:
            cards[key].blocks.append(b.path)

    run_with_pre_hooks(model, inputs, run, [model.get_submodule(b.path) for b in blocks], pre_hook, with_kwargs=True)
    timer = Timer(device, repeats=repeats)
    forward_us: float | None = None
    out: list[ExpertsCard] = []
    for key, card in cards.items():
        m, b, x = captured[key]
        with torch.no_grad():
            ref = m(x)
            rets = returns_of(ref, b, x)
            if rets is None:
                card.refused = "the block returns something other than its output (and router logits)"
                card.card = card_id(b, b.program(False, "other"), card.input.model_dump())
                out.append(card)
                continue
            card.output = tensor_spec(ref[0] if isinstance(ref, tuple) else ref, "output")
            stacked = Stacked(b, m, repoint=False)
            gate = m._modules[b.router].weight
            logits = rets == "tensor_logits"
            norms = [b.norm] if b.norm is not None else [True, False]
            bad = ""
            for norm in norms:
                try:
                    bad = check(routed(x, gate, stacked, b, norm, logits, m), ref) or ""
                except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
                    bad = f"it failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if not bad:
                    break
            card.program = b.program(norm, rets)
            card.card = card_id(b, card.program, card.input.model_dump())
            out.append(card)
            if bad:
                card.refused = f"the grouped pass does not match the block on the captured input: {bad}"
                continue
            card.input_sets.append("captured")
            rand = random_like(x)
            bad = check(routed(rand, gate, stacked, b, norm, logits, m), m(rand)) or ""
            if bad:
                card.refused = f"the grouped pass does not match the block on the random input: {bad}"
                continue
            card.input_sets.append("random")
            fns = {"block": functools.partial(m, x),
                   "grouped": functools.partial(routed, x, gate, stacked, b, norm, logits, m)}
            if vs_compile:
                compiled, card.compile_note = _compiled_block(m, x)
                if compiled is not None:
                    fns["compiled"] = functools.partial(compiled, x)
            stats, raw, _ = timer.time(fns)
            if forward_us is None:
                fstats, _, _ = timer.time({"forward": functools.partial(run, model, inputs)})
                forward_us = fstats["forward"].median
            del stacked
        card.eager, card.grouped = stats["block"], stats["grouped"]
        card.speedup = paired_ratio(raw["block"], raw["grouped"])
        if "compiled" in raw:
            card.compiled, card.vs_compile = stats["compiled"], paired_ratio(raw["compiled"], raw["grouped"])
        n = sum(calls.get(p, 0) for p in card.blocks)
        card.share = min(1.0, n * card.eager.median / forward_us) if forward_us else None
        card.refused = speed_refusal(card.speedup, min_speedup, "the block's own forward")
    return sorted(out, key=lambda c: c.card), why


def promote(ws: Any, cards: list[ExpertsCard], *, by: str | None = None) -> list[Entry]:
    """Promote the experts cards not refused (``kernels/<card>/experts.json``)."""
    return promote_cards(ws, list(cards), "serve {n} routed-experts card{s} in one grouped pass", by=by)


def experts_workload(spec: str, ws: Any, *, device: str | None = None, dtype: Any = None, dry_run: bool = False,
                     repeats: int = 20, min_speedup: float | None = None
                     ) -> tuple[list[ExpertsCard], dict[str, str], list[Entry]]:
    """``forge experts``: propose the workload's experts cards and (unless ``dry_run``) promote
    them. ``min_speedup``: the least isolated speedup over the block's own forward a card is
    promoted with (default: faster, above 1.0; 0 promotes every card that matches)."""
    return run_rewrite(spec, ws, propose, promote, "the model has no routed mixture-of-experts block "
                       "(a gate linear and a ModuleList of gated-MLP experts)",
                       device=device, dtype=dtype, dry_run=dry_run, repeats=repeats, min_speedup=min_speedup)


REWRITE = Rewrite(
    name="experts", kind=CardKind.EXPERTS, installer="forge_tui.runtime.kinds.experts", file=EXPERTS_FILE,
    run=experts_workload, help="compute the workload's routed mixture-of-experts blocks in one grouped pass each, "
    "without their Python loop", own="the block's own forward", unit="blocks", not_served="not served",
    doing="grouping routed experts", report_key="not_served", share_in_config=True)
"""``forge experts`` in the registry (``forge_tui.rewrites.REWRITES``)."""
