"""``forge fold WORKLOAD -w WS``: the workload's batch norms folded into their convolutions, as fold
cards promoted to the workspace's manifest.

Its other half is the runtime's: ``forge_tui/runtime/fold.py`` says what a fold is, finds the
foldable pairs and serves a fold card in a model, and ``forge_tui/runtime/kinds/fold.py`` installs
the cards; this module proposes, checks, times and promotes them.

The model runs once on the workload's inputs with a hook on each foldable pair's convolution
(``runtime.fold.find_pairs``); pairs whose calls look alike (the two modules' configurations, the
convolution's input shape, strides and dtype) make one fold card, as alike calls make one
operator card. Each card is checked and timed on its first call's captured input and on a random
input of the same spec: the folded convolution against the pair's own two calls, within the
evaluator's tolerance, then both timed interleaved with the evaluator's timer. A card that matches
and is faster is promoted, its evidence (speedup with spread, the input sets) and its configuration
(``kernels/<card>/fold.json``) committed to ``main`` with who approved it; running the command is
the approval, as ``forge approve`` is for kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..cards import CardKind
from ..runtime.fold import FOLD_FILE, Pair, check_fold, find_pairs, fold_card_id, fold_program, fold_target, folded_params, pair_reference
from ..runtime.manifest import Entry
from ..timing import Stats, Timer, paired_ratio
from .base import Rewrite, RewriteCard, promote_cards, random_like, rewrite_line, run_rewrite, run_with_pre_hooks, speed_refusal, tensor_spec


@dataclass
class FoldCard(RewriteCard):
    pairs: list[Pair] = field(default_factory=list)
    folded: Stats | None = None

    kind: ClassVar[CardKind] = CardKind.FOLD
    file: ClassVar[str] = FOLD_FILE
    timed_as: ClassVar[tuple[str, str]] = ("pair_us", "folded_us")

    def after(self) -> Stats | None:
        return self.folded

    def sites(self) -> list[str]:
        return [p.bn_path for p in self.pairs]

    def config(self) -> dict[str, Any]:
        return {"pairs": [{"parent": p.parent, "conv": p.conv, "bn": p.bn} for p in self.pairs]}

    def line(self) -> str:
        return rewrite_line(self, len(self.pairs), "pair", "not folded", "the pair's own calls", self.folded)

    def site_json(self) -> dict[str, Any]:
        return {"pairs": [p.bn_path for p in self.pairs]}


def propose(model: Any, inputs: list[Any], run: Any, device: str, *, repeats: int = 20,
            min_speedup: float | None = None) -> tuple[list[FoldCard], dict[str, str]]:
    """The fold cards of ``model`` (in eval mode) on ``inputs``, each checked and timed; and why
    the modules with a batch norm whose forward was looked at fold nothing."""
    import torch

    pairs, why = find_pairs(model)
    cards: dict[str, FoldCard] = {}
    captured: dict[str, Any] = {}
    by_conv: dict[int, tuple[Any, list[Pair]]] = {}
    """id of a convolution -> (it, its pairs)."""
    for p in pairs:
        conv = model.get_submodule(p.conv_path)
        by_conv.setdefault(id(conv), (conv, []))[1].append(p)

    def pre_hook(conv: Any, args: tuple) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        for p in by_conv.get(id(conv), (None, []))[1]:
            bn = model.get_submodule(p.bn_path)
            spec = tensor_spec(x, "input")
            cid = fold_card_id(conv, bn, spec.model_dump())
            card = cards.get(cid)
            if card is None:
                out = tensor_spec(torch.empty(0), "output")  # set below from the pair's own output
                card = cards[cid] = FoldCard(cid, fold_target(conv, bn), spec, out, fold_program(conv, bn))
                captured[cid] = (conv, bn, x.detach().clone())
            if p not in card.pairs:
                card.pairs.append(p)

    run_with_pre_hooks(model, inputs, run, [conv for conv, _ in by_conv.values()], pre_hook)
    timer = Timer(device, repeats=repeats)
    for cid, card in cards.items():
        conv, bn, x = captured[cid]
        with torch.no_grad():
            ref = pair_reference(conv, bn, x)
            card.output = tensor_spec(ref, "output")
            w, b = folded_params(conv, bn, x.dtype)
            for name, inp in (("captured", x), ("random", random_like(x))):
                bad = check_fold(conv._conv_forward(inp, w, b), pair_reference(conv, bn, inp))
                if bad is not None:
                    card.refused = f"the folded convolution does not match the pair on the {name} input: {bad}"
                    break
                card.input_sets.append(name)
            if card.refused:
                continue
            stats, raw, _ = timer.time({"pair": functools.partial(pair_reference, conv, bn, x),
                                        "folded": functools.partial(conv._conv_forward, x, w, b)})
        card.eager, card.folded = stats["pair"], stats["folded"]
        card.speedup = paired_ratio(raw["pair"], raw["folded"])
        card.refused = speed_refusal(card.speedup, min_speedup, "the pair's own calls")
    return sorted(cards.values(), key=lambda c: c.card), why


def promote(ws: Any, cards: list[FoldCard], *, by: str | None = None) -> list[Entry]:
    """Promote the fold cards not refused (``kernels/<card>/fold.json``)."""
    return promote_cards(ws, list(cards), "fold {n} batch norm card{s} into their convolutions", by=by)


def fold_workload(spec: str, ws: Any, *, device: str | None = None, dtype: Any = None, dry_run: bool = False,
                  repeats: int = 20, min_speedup: float | None = None) -> tuple[list[FoldCard], dict[str, str], list[Entry]]:
    """``forge fold``: propose the workload's fold cards and (unless ``dry_run``) promote them.
    ``min_speedup``: the least isolated speedup over the pair's own calls a card is promoted with
    (default: faster, above 1.0; 0 promotes every fold that matches)."""
    return run_rewrite(spec, ws, propose, promote, "the model has no batch norm after a convolution to fold",
                       device=device, dtype=dtype, dry_run=dry_run, repeats=repeats, min_speedup=min_speedup)


REWRITE = Rewrite(
    name="fold", kind=CardKind.FOLD, installer="forge_tui.runtime.kinds.fold", file=FOLD_FILE, run=fold_workload,
    help="fold the workload's batch norms into their convolutions", own="the pair's own calls",
    unit="batch norms", not_served="no fold", doing="folding batch norms into their convolutions",
    report_key="not_folded", switched_off_together=True)
"""``forge fold`` in the registry (``forge_tui.rewrites.REWRITES``)."""
