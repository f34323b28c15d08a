"""``forge merge WORKLOAD -w WS``: the workload's sibling linears (called one after another on one
input: q/k/v projections, gate and up) computed in one batched product, as merge cards promoted to
the workspace's manifest.

Its other half is the runtime's: ``forge_tui/runtime/merge.py`` says what the product is and
serves a merge card in a model, and ``forge_tui/runtime/kinds/merge.py`` installs the cards; this
module finds the siblings in a run, proposes, checks, times and promotes the cards.

The model runs once on the workload's inputs with a hook on every ``nn.Linear``: linears called
on the same tensor object, unchanged between the calls, are siblings where they are so in every
call (a linear called on one input alone in some call and with others in another is not), and a
set of siblings merges where they have the same sizes, bias or none, dtype and device (grouped
query attention's k and v merge; its wider q stays alone). Linears inside routed-experts blocks
are left to ``forge experts``. Sets whose calls look alike (the number of siblings, their sizes,
the input's shape, strides and dtype) make one merge card. Each card is checked on a captured
input of its first call's spec (the run keeps one input of each spec) and on a random one (every sibling's output against its own, within the
evaluator's tolerance), then both ways are timed interleaved with the evaluator's timer. A card
that matches and is faster is promoted with its evidence (speedup with spread, the input sets,
its share of the forward) and its configuration (``kernels/<card>/merge.json``), committed to
``main`` with who approved it; running the command is the approval, as ``forge approve`` is for
kernels.
"""

from __future__ import annotations

import functools
import json
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..cards import CardKind
from ..runtime.manifest import Entry
from ..runtime.merge import MERGE_FILE, Stacked, card_id, check, is_linear, merged, program_of, target, unmergeable
from ..timing import Stats, Timer, paired_ratio
from .base import Rewrite, RewriteCard, promote_cards, random_like, rewrite_line, run_rewrite, run_with_pre_hooks, speed_refusal, tensor_spec


@dataclass
class MergeCard(RewriteCard):
    groups: list[list[str]] = field(default_factory=list)
    merged: Stats | None = None

    kind: ClassVar[CardKind] = CardKind.MERGE
    file: ClassVar[str] = MERGE_FILE
    timed_as: ClassVar[tuple[str, str]] = ("separate_us", "merged_us")

    def after(self) -> Stats | None:
        return self.merged

    def sites(self) -> list[str]:
        return [p for qs in self.groups for p in qs]

    def config(self) -> dict[str, Any]:
        return {"groups": self.groups, "share": self.share}

    def line(self) -> str:
        return rewrite_line(self, len(self.groups), "set", "not merged", "the separate linears", self.merged)

    def site_json(self) -> dict[str, Any]:
        return {"groups": self.groups, "share": self.share}


def find_siblings(model: Any, inputs: list[Any], run: Any
                  ) -> tuple[list[list[str]], dict[str, str], dict[str, Any], dict[str, int]]:
    """The sets of sibling linears of ``model`` on ``inputs`` (module paths, in call order), why
    linears that share an input with others are not merged, a real input for each set (by its
    first path: one kept of the spec of that path's first call) and each linear's calls in the
    run. No other input is kept alive by the run."""
    import torch

    from ..runtime.experts import find_blocks

    blocks, _ = find_blocks(model)
    inside = tuple(b.path + "." for b in blocks)
    linears = {id(m): p for p, m in model.named_modules() if is_linear(m) and not (inside and p.startswith(inside))}
    calls: list[tuple[str, int, int | None, str]] = []
    """(a linear's path, its input's token, the input's version or None, the input's spec)."""
    tokens: dict[int, tuple[Any, int]] = {}
    """id of an input -> (a weak reference to it, its token): a tensor freed and another made at
    its address get different tokens, and no input is kept alive by the run."""
    held: dict[str, Any] = {}
    """One input of each spec (shape, strides, dtype), kept for the cards' checks and timing."""
    odd: set[str] = set()

    def pre_hook(m: Any, args: tuple, kwargs: dict) -> None:
        path = linears.get(id(m))
        if path is None:
            return
        if kwargs or len(args) != 1 or type(args[0]) is not torch.Tensor:
            odd.add(path)
            return
        x = args[0]
        seen_as = tokens.get(id(x))
        if seen_as is None or seen_as[0]() is not x:
            seen_as = tokens[id(x)] = (weakref.ref(x), len(calls))
        spec = tensor_spec(x, "input").model_dump_json()
        held.setdefault(spec, x)
        calls.append((path, seen_as[1], None if x.is_inference() else x._version, spec))

    run_with_pre_hooks(model, inputs, run, [m for m in model.modules() if id(m) in linears], pre_hook,
                       with_kwargs=True)
    on: dict[tuple[int, int | None], list[str]] = {}
    for path, token, ver, _ in calls:
        on.setdefault((token, ver), []).append(path)
    seen: dict[str, set[frozenset[str]]] = {}
    twice: set[str] = set()
    for paths in on.values():
        if len(set(paths)) != len(paths):
            twice.update(p for p in paths if paths.count(p) > 1)
        for p in paths:
            seen.setdefault(p, set()).add(frozenset(paths))
    why: dict[str, str] = {}
    order = {c[0]: i for i, c in reversed(list(enumerate(calls)))}
    sets: list[list[str]] = []
    first: dict[str, Any] = {}
    done: set[frozenset[str]] = set()
    for p, partners in seen.items():
        if len(partners) == 1 and len(next(iter(partners))) == 1:
            continue  # a linear alone on its inputs: nothing to merge, nothing to say
        if p in odd or p in twice or len(partners) != 1:
            why[p] = ("called with other arguments than one input tensor" if p in odd else
                      "called twice on one input" if p in twice else
                      "its input is shared with other linears in some calls and not in others")
            continue
        s = next(iter(partners))
        if s in done or any(seen.get(q) != {s} or q in odd or q in twice for q in s):
            continue
        done.add(s)
        mods = {q: model.get_submodule(q) for q in s}
        by_prog: dict[str, list[str]] = {}
        for q in sorted(s, key=order.__getitem__):
            m = mods[q]
            key = json.dumps(program_of([m]) | {"dtype": str(m.weight.dtype), "device": str(m.weight.device)})
            by_prog.setdefault(key, []).append(q)
        for qs in by_prog.values():
            if len(qs) < 2:
                why[qs[0]] = "its siblings on the same input have other sizes, biases, dtype or device"
                continue
            bad = unmergeable([mods[q] for q in qs])
            if bad:
                for q in qs:
                    why[q] = bad
                continue
            sets.append(qs)
    for path, _, _, spec in calls:
        for qs in sets:
            if qs[0] == path and path not in first:
                first[path] = held[spec]
    sets.sort(key=lambda qs: order[qs[0]])
    counts: dict[str, int] = {}
    for c in calls:
        counts[c[0]] = counts.get(c[0], 0) + 1
    return sets, why, first, counts


def _owners(model: Any, paths: list[str]) -> list[tuple[Any, str]]:
    out = []
    for p in paths:
        parent, _, name = p.rpartition(".")
        out.append((model.get_submodule(parent) if parent else model, name))
    return out


def propose(model: Any, inputs: list[Any], run: Any, device: str, *, repeats: int = 20,
            min_speedup: float | None = None) -> tuple[list[MergeCard], dict[str, str]]:
    """The merge cards of ``model`` (in eval mode) on ``inputs``, each checked and timed; and why
    linears that share an input with others are not merged."""
    import torch

    sets, why, first, counts = find_siblings(model, inputs, run)
    cards: dict[str, MergeCard] = {}
    captured: dict[str, tuple[list[str], Any]] = {}
    for qs in sets:
        x = first[qs[0]]
        mods = [model.get_submodule(q) for q in qs]
        spec = tensor_spec(x, "input")
        prog = program_of(mods)
        cid = card_id(prog, spec.model_dump())
        if cid not in cards:
            cards[cid] = MergeCard(cid, target(prog), spec, tensor_spec(torch.empty(0), "output"), prog)
            captured[cid] = (qs, x.detach().clone())
        cards[cid].groups.append(qs)
    timer = Timer(device, repeats=repeats)
    forward_us: float | None = None
    for cid, card in cards.items():
        qs, x = captured[cid]
        mods = [model.get_submodule(q) for q in qs]
        with torch.no_grad():
            st = Stacked(_owners(model, qs), repoint=False)
            refs = [m(x) for m in mods]
            card.output = tensor_spec(refs[0], "output")
            for name, inp in (("captured", x), ("random", random_like(x))):
                try:
                    bad = check(merged(inp, st), [m(inp) for m in mods])
                except (RuntimeError, ValueError, TypeError) as exc:
                    bad = f"it failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if bad is not None:
                    card.refused = f"the batched product does not match the linears on the {name} input: {bad}"
                    break
                card.input_sets.append(name)
            if card.refused:
                continue
            stats, raw, _ = timer.time({"separate": functools.partial(_separate, mods, x),
                                        "merged": functools.partial(_separate, _served_copies(mods, device), x)})
            if forward_us is None:
                fstats, _, _ = timer.time({"forward": functools.partial(run, model, inputs)})
                forward_us = fstats["forward"].median
        card.eager, card.merged = stats["separate"], stats["merged"]
        card.speedup = paired_ratio(raw["separate"], raw["merged"])
        n = sum(counts.get(qs[0], 1) for qs in card.groups)
        card.share = min(1.0, n * card.eager.median / forward_us) if forward_us else None
        card.refused = speed_refusal(card.speedup, min_speedup, "the separate linears")
    return sorted(cards.values(), key=lambda c: c.card), why


def _separate(mods: list[Any], x: Any) -> list[Any]:
    return [m(x) for m in mods]


def _served_copies(mods: list[Any], device: str) -> list[Any]:
    """Copies of the siblings served as the runtime serves them (guards, the product at the first
    call, the stored slices after): what a served set costs, module calls included."""
    import copy

    from torch import nn

    from ..runtime.merge import Group, Member, MergeGuard
    from ..runtime.status import StatusBoard

    holder = nn.Module()
    names = [f"s{i}" for i in range(len(mods))]
    for n, m in zip(names, mods):
        holder.add_module(n, copy.deepcopy(m))
    copies = [holder.get_submodule(n) for n in names]
    guard = MergeGuard("proposal", "proposal", copies[0].weight.dtype, device, StatusBoard(), 0, program_of(copies))
    group = Group(guard, copies, Stacked([(holder, n) for n in names], repoint=True))
    for i, c in enumerate(copies):
        c.forward = Member(group, i)
    return copies


def promote(ws: Any, cards: list[MergeCard], *, by: str | None = None) -> list[Entry]:
    """Promote the merge cards not refused (``kernels/<card>/merge.json``)."""
    return promote_cards(ws, list(cards), "merge {n} card{s} of sibling linears into one product each", by=by)


def merge_workload(spec: str, ws: Any, *, device: str | None = None, dtype: Any = None, dry_run: bool = False,
                   repeats: int = 20, min_speedup: float | None = None
                   ) -> tuple[list[MergeCard], dict[str, str], list[Entry]]:
    """``forge merge``: propose the workload's merge cards and (unless ``dry_run``) promote them.
    ``min_speedup``: the least isolated speedup over the separate linears a card is promoted with
    (default: faster, above 1.0; 0 promotes every card that matches)."""
    return run_rewrite(spec, ws, propose, promote, "the model has no linears called one after another on one input to merge",
                       device=device, dtype=dtype, dry_run=dry_run, repeats=repeats, min_speedup=min_speedup)


REWRITE = Rewrite(
    name="merge", kind=CardKind.MERGE, installer="forge_tui.runtime.kinds.merge", file=MERGE_FILE, run=merge_workload,
    help="compute the workload's sibling linears (called one after another on one input: q/k/v, gate and up) in "
    "one batched product", own="the separate linears", unit="linears", not_served="not merged",
    doing="merging sibling linears", report_key="not_merged", switched_off_together=True, share_in_config=True)
"""``forge merge`` in the registry (``forge_tui.rewrites.REWRITES``)."""
