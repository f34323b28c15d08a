"""``forge fold WORKLOAD -w WS``: the workload's batch norms folded into their convolutions, as fold
cards promoted to the workspace's manifest (``runtime/fold.py`` says what a fold is and how the
runtime serves it).

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

from .cards import TensorSpec
from .errors import ForgeError
from .runtime.fold import FOLD_FILE, Pair, check_fold, find_pairs, fold_card_id, fold_program, fold_target, folded_params, pair_reference
from .runtime.manifest import Entry, Signature
from .timing import Stats, Timer, paired_ratio


@dataclass
class RewriteCard:
    """A card of a rewrite of the model's own code (fold, experts, merge): what it serves, its
    checks, its isolated timing against the model's own calls (``eager``), its share of the
    forward and why it was refused."""

    card: str
    target: str
    input: TensorSpec
    output: TensorSpec
    program: dict[str, Any]
    speedup: Stats | None = None
    eager: Stats | None = None
    share: float | None = None
    """The sites' share of the forward in eager: their calls x their own time / the forward."""
    refused: str = ""
    input_sets: list[str] = field(default_factory=list)

    kind: ClassVar[str] = ""
    file: ClassVar[str] = ""
    """Its configuration's name in ``kernels/<card>/``."""

    def after(self) -> Stats | None:
        """The rewrite's own time alone."""
        raise NotImplementedError

    def sites(self) -> list[str]:
        """The module paths its manifest entry names."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What its configuration file holds besides its target and program."""
        raise NotImplementedError

    def returns(self) -> str:
        return "tensor"

    def line(self) -> str:
        raise NotImplementedError


@dataclass
class FoldCard(RewriteCard):
    pairs: list[Pair] = field(default_factory=list)
    folded: Stats | None = None

    kind: ClassVar[str] = "fold"
    file: ClassVar[str] = FOLD_FILE

    def after(self) -> Stats | None:
        return self.folded

    def sites(self) -> list[str]:
        return [p.bn_path for p in self.pairs]

    def config(self) -> dict[str, Any]:
        return {"pairs": [{"parent": p.parent, "conv": p.conv, "bn": p.bn} for p in self.pairs]}

    def line(self) -> str:
        return rewrite_line(self, len(self.pairs), "pair", "not folded", "the pair's own calls", self.folded)


def rewrite_line(c: Any, sites: int, site: str, refused: str, own: str, after: Stats | None) -> str:
    """A rewrite card in one line: its sites, and why it was refused or its isolated
    speedup over the model's own calls (``own``) with spread, before -> ``after`` µs."""
    at = f"{sites} {site}{'s' if sites > 1 else ''}"
    if c.refused:
        return f"{c.card} ({c.target}, {at}): {refused}: {c.refused}"
    assert c.speedup is not None and c.eager is not None and after is not None
    return (f"{c.card} ({c.target}, {at}, input {'x'.join(map(str, c.input.shape))} {c.input.dtype}): "
            f"{c.speedup.median:.2f}x [{c.speedup.q1:.2f}, {c.speedup.q3:.2f}] {own} "
            f"({c.eager.median:.1f} -> {after.median:.1f} µs), matches on {len(c.input_sets)} input sets")


def tensor_spec(t: Any, role: str) -> TensorSpec:
    """A tensor's shape, strides, dtype and role, as fold and experts cards key their calls."""
    return TensorSpec(shape=list(t.shape), stride=list(t.stride()), dtype=str(t.dtype).removeprefix("torch."), role=role)


def run_with_pre_hooks(model: Any, inputs: list[Any], run: Any, modules: Any, hook: Any, *,
                       with_kwargs: bool = False) -> None:
    """Run the workload's forward once, without gradients, with ``hook`` a forward pre-hook on
    each of ``modules`` (removed after, whatever happens): how the rewrite commands see the
    model's calls."""
    import torch

    hooks = [m.register_forward_pre_hook(hook, with_kwargs=with_kwargs) for m in modules]
    try:
        with torch.no_grad():
            run(model, inputs)
    finally:
        for h in hooks:
            h.remove()


def random_like(x: Any) -> Any:
    """A random tensor of ``x``'s shape and dtype with its mean and spread (seeded): the second
    input set a rewrite card is checked on."""
    import torch

    gen = torch.Generator(device=x.device).manual_seed(0)
    r = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32)
    return (r * x.float().std() + x.float().mean()).to(x.dtype)


def speed_refusal(speedup: Stats, min_speedup: float | None, own: str) -> str:
    """Why a rewrite card with this isolated speedup over the model's own calls (``own``) is not
    promoted: by default, not faster, or not faster beyond its spread (a quarter of the paired
    runs or more as slow as the model's own or slower: a card whose median alone is above 1 can
    cost more than it saves, a merge by keeping its scope from running as one compiled graph);
    with ``min_speedup``, below it; "" if it is promoted."""
    if min_speedup is None and speedup.median <= 1.0:
        return f"not faster than {own} ({speedup.median:.3f}x)"
    if min_speedup is None and speedup.q1 <= 1.0:
        return (f"not faster than {own} beyond its spread ({speedup.median:.3f}x [{speedup.q1:.3f}, "
                f"{speedup.q3:.3f}]: as slow or slower in a quarter of the paired runs)")
    if min_speedup is not None and speedup.median < min_speedup:
        return f"{speedup.median:.3f}x {own}, below --min-speedup {min_speedup:g}"
    return ""


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


def promote_cards(ws: Any, cards: list[RewriteCard], subject: str, *, by: str | None = None) -> list[Entry]:
    """Promote the rewrite cards not refused: ``kernels/<card>/<file>`` and a manifest entry each
    (its evidence: the isolated speedup with spread, the input sets), one commit on ``main`` with
    ``subject`` (``{n}``: how many). Returns the entries."""
    from .promotion import Rewrite, promote_rewrites

    keep = [c for c in cards if not c.refused]
    rewrites = []
    for c in keep:
        after = c.after()
        assert c.speedup is not None and c.eager is not None and after is not None
        sig = Signature(card=c.card, kind=c.kind, target=c.target, inputs=[c.input], outputs=[c.output],
                        program=c.program, module_paths=c.sites(), returns=c.returns(), flags=[c.kind])
        config = {"target": c.target, "program": c.program} | c.config()
        rewrites.append(Rewrite(sig, c.file, config, c.speedup, c.eager.median, after.median, c.input_sets,
                                c.line()))
    return promote_rewrites(ws, rewrites, subject.format(n=len(keep), s="s" if len(keep) > 1 else ""), by=by)


def promote(ws: Any, cards: list[FoldCard], *, by: str | None = None) -> list[Entry]:
    """Promote the fold cards not refused (``kernels/<card>/fold.json``)."""
    return promote_cards(ws, list(cards), "fold {n} batch norm card{s} into their convolutions", by=by)


def run_rewrite(spec: str, ws: Any, propose: Any, promote: Any, none: str, *, device: str | None, dtype: Any,
                dry_run: bool, repeats: int, min_speedup: float | None) -> tuple[list[Any], dict[str, str], list[Entry]]:
    """A rewrite command on a workload: build its model (eval mode) where it runs, ``propose`` the
    cards, ``promote`` them unless ``dry_run``; ``none``: the error where the model has nothing
    the rewrite looks for."""
    from .workload import load_workload, resolve_device

    if min_speedup is not None and min_speedup < 0:
        raise ForgeError(f"--min-speedup must be 0 or more, not {min_speedup:g}")
    dev = resolve_device(device)
    wl = load_workload(spec)
    model, inputs = wl.build(dev, dtype)
    model.eval()
    cards, why = propose(model, inputs, wl.run, dev, repeats=repeats, min_speedup=min_speedup)
    if not cards and not why:
        raise ForgeError(f"{wl.path.name}: {none}")
    entries = [] if dry_run else promote(ws, cards)
    return cards, why, entries


def fold_workload(spec: str, ws: Any, *, device: str | None = None, dtype: Any = None, dry_run: bool = False,
                  repeats: int = 20, min_speedup: float | None = None) -> tuple[list[FoldCard], dict[str, str], list[Entry]]:
    """``forge fold``: propose the workload's fold cards and (unless ``dry_run``) promote them.
    ``min_speedup``: the least isolated speedup over the pair's own calls a card is promoted with
    (default: faster, above 1.0; 0 promotes every fold that matches)."""
    return run_rewrite(spec, ws, propose, promote, "the model has no batch norm after a convolution to fold",
                       device=device, dtype=dtype, dry_run=dry_run, repeats=repeats, min_speedup=min_speedup)
