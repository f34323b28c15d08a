"""What the rewrites of the model's own code share (``fold.py``, ``experts.py``, ``merge.py``): a
rewrite's card, its registry entry (``Rewrite``), and the steps every rewrite command takes.

A rewrite command (``forge fold|experts|merge WORKLOAD -w WS``) builds the workload's model in
eval mode, runs it once with hooks on the modules the rewrite looks for (``run_with_pre_hooks``),
makes one card per group of alike sites, checks each card's rewritten computation against the
model's own on the captured input and a random one (``random_like``), times both interleaved, and
promotes the cards faster beyond their spread (``speed_refusal``) to the workspace's manifest
(``promote_cards``): ``run_rewrite`` is that command. Each rewrite's other half, the code that
serves its cards in a model, lies in the runtime (``forge_tui/runtime/<name>.py`` and its
installer ``forge_tui/runtime/kinds/<name>.py``), which never imports this package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..cards import CardKind, TensorSpec
from ..errors import ForgeError
from ..runtime.manifest import Entry, Signature
from ..timing import Stats

RewriteRun = Callable[..., tuple[list[Any], dict[str, str], list[Entry]]]
"""A rewrite command on a workload: ``run(spec, ws, *, device, dtype, dry_run, repeats,
min_speedup)`` -> (its cards, why look-alike sites are not served by path, the promoted entries)."""


@dataclass(frozen=True)
class Rewrite:
    """One rewrite in the registry (``forge_tui.rewrites.REWRITES``): everything the CLI, the app,
    the search and the bench need to run it or to tell its cards apart."""

    name: str
    """Its command, ``forge NAME``."""
    kind: CardKind
    """The kind of its cards, in the manifest and in ``forge_tui.runtime.apply.KINDS``."""
    installer: str
    """The runtime module that serves its cards (``KINDS[kind]``): its other half."""
    file: str
    """Its configuration's name in ``kernels/<card>/``."""
    run: RewriteRun
    help: str
    """What the command does, for ``forge --help``."""
    own: str
    """What its cards' speedup is measured against ("the pair's own calls")."""
    unit: str
    """What its sites are, in the command's summary ("batch norms")."""
    not_served: str
    """How the command introduces a site it does not serve ("no fold")."""
    doing: str
    """What the app says while it runs ("folding batch norms into their convolutions")."""
    report_key: str
    """The key under which the bench's report lists the sites it does not serve."""
    switched_off_together: bool = False
    """The bench leaves its cards out all at once, not one by one: many sites, each saving little."""
    share_in_config: bool = False
    """Its configuration records its sites' share of the forward in eager (``"share"``)."""


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

    kind: ClassVar[CardKind]
    file: ClassVar[str] = ""
    """Its configuration's name in ``kernels/<card>/``."""
    timed_as: ClassVar[tuple[str, str]] = ("eager_us", "after_us")
    """The names of its two times (the model's own, the rewrite's) in the bench's report."""

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

    def site_json(self) -> dict[str, Any]:
        """Its sites as the bench's report lists them."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The card in the bench's report: why it was refused, its sites, its speedup and both times."""
        after = self.after()
        before_us, after_us = self.timed_as
        return ({"refused": self.refused} | self.site_json() |
                {"speedup": self.speedup.to_json() if self.speedup else None,
                 before_us: self.eager.median if self.eager else None, after_us: after.median if after else None})


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
    runs or more as slow as the model's own or slower: a card whose gain is within its noise can
    still cost the model, a merge for one by keeping its scope from running as one compiled
    graph); with ``min_speedup``, below it; "" if it is promoted."""
    if min_speedup is None and speedup.median <= 1.0:
        return f"not faster than {own} ({speedup.median:.3f}x)"
    if min_speedup is None and speedup.q1 <= 1.0:
        return (f"not faster than {own} beyond its spread ({speedup.median:.3f}x [{speedup.q1:.3f}, "
                f"{speedup.q3:.3f}]: as slow or slower in a quarter of the paired runs)")
    if min_speedup is not None and speedup.median < min_speedup:
        return f"{speedup.median:.3f}x {own}, below --min-speedup {min_speedup:g}"
    return ""


def promote_cards(ws: Any, cards: list[RewriteCard], subject: str, *, by: str | None = None) -> list[Entry]:
    """Promote the rewrite cards not refused: ``kernels/<card>/<file>`` and a manifest entry each
    (its evidence: the isolated speedup with spread, the input sets), one commit on ``main`` with
    ``subject`` (``{n}``: how many). Returns the entries."""
    from ..promotion import Rewrite as Promoted
    from ..promotion import promote_rewrites

    keep = [c for c in cards if not c.refused]
    rewrites = []
    for c in keep:
        after = c.after()
        assert c.speedup is not None and c.eager is not None and after is not None
        sig = Signature(card=c.card, kind=c.kind, target=c.target, inputs=[c.input], outputs=[c.output],
                        program=c.program, module_paths=c.sites(), returns=c.returns(), flags=[c.kind.value])
        config = {"target": c.target, "program": c.program} | c.config()
        vs_compile, compiled = getattr(c, "vs_compile", None), getattr(c, "compiled", None)
        rewrites.append(Promoted(sig, c.file, config, c.speedup, c.eager.median, after.median, c.input_sets,
                                c.line(), vs_compile, compiled.median if compiled is not None else None))
    return promote_rewrites(ws, rewrites, subject.format(n=len(keep), s="s" if len(keep) > 1 else ""), by=by)


def run_rewrite(spec: str, ws: Any, propose: Any, promote: Any, none: str, *, device: str | None, dtype: Any,
                dry_run: bool, repeats: int, min_speedup: float | None) -> tuple[list[Any], dict[str, str], list[Entry]]:
    """A rewrite command on a workload: build its model (eval mode) where it runs, ``propose`` the
    cards, ``promote`` them unless ``dry_run``; ``none``: the error where the model has nothing
    the rewrite looks for."""
    from ..workload import load_workload, resolve_device

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
