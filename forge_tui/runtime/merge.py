"""Sibling linears in one batched product: attention's q/k/v projections, a gated MLP's gate and up.

Most models call several linears on one input one after another (``q = to_q(x); k = to_k(x); v =
to_v(x)``). Each call is a module call, a dispatch and a matrix product that reads ``x`` again; in
a forward bound by the host (the bundled diffusion's, 57 µs of host a ``Linear`` call on the H200
machine in the tenth session), the calls cost more than the products. Here the first of the
siblings to be called computes all of them in one ``bmm`` (``baddbmm`` with biases) over ``x``
expanded to ``[siblings, rows, in]`` (a stride-0 view: no copy), each output a contiguous slice
of one ``[siblings, rows, out]`` tensor; the others, called next on the same ``x``, return their
slice. On the H200 (``bench/lab/merge_linear_probe.py``, 2026-12-03) the outputs were bit for bit
the separate linears', and the bare product of the diffusion's q/k/v took 50 µs against 101; as
served (guards, stored slices, module calls) only some sets gain: ``forge merge`` times each card
that way and promotes only those faster (docs/benchmarks.md, 2026-12-03 evening).

Which linears are siblings is read from a run of the model (``forge_tui/rewrites/merge.py``: ``forge merge``): the
``nn.Linear`` modules called on the same tensor object, unchanged between the calls, in every
call, with the same input and output sizes, bias or none, dtype and device.

Installing stacks the siblings' weights (and biases) into one tensor and points each parameter at
its slice (``pinned.Pinned``). A sibling's call returns a stored output only where it can be
nothing else: the same tensor object (a weak reference: never a new tensor at a freed one's
address) at the same version and shape (no in-place change since), that sibling's own weight and
bias the same objects at the same versions, the same thread and CUDA stream, no gradient or
autocast wanted since, and that sibling not yet served from this product; anything
else computes the product again. Every call is guarded and runs the linear's own forward where
the product would not compute what it does: another call signature, device, dtype or input
size, a tensor subclass, an inference tensor (it keeps no version counter to prove the input
unchanged), gradients needed, autocast on, or a weight or linear replaced since the install. The
first product (and every ``shadow_every``-th) is compared with every sibling's own output; a
mismatch or an error disables the card and that call returns the linear's own value. Merges are
not installed in models to be torch.compile'd: Dynamo would break its graphs at each call.

This is the runtime's half of the merge rewrite: ``kinds/merge.py`` installs its cards, and
``forge_tui/rewrites/merge.py`` (``forge merge``) proposes, checks, times and promotes them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..cards import CardKind
from .fold import RewriteGuard, check_fold
from .pinned import Pinned, owns_storage

if TYPE_CHECKING:
    import torch


MERGE_FILE = "merge.json"


def is_linear(m: Any) -> bool:
    """An ``nn.Linear`` whose forward is the class's own (``F.linear`` of its weight and bias)."""
    import torch

    return isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward \
        and "forward" not in m.__dict__


def program_of(mods: list[Any]) -> dict[str, Any]:
    first = mods[0]
    return {"members": len(mods), "in": int(first.in_features), "out": int(first.out_features),
            "bias": first.bias is not None}


def card_id(program: dict[str, Any], spec: dict[str, Any]) -> str:
    key = json.dumps({"program": program, "input": spec}, sort_keys=True)
    return f"merge-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def target(program: dict[str, Any]) -> str:
    return f"{program['members']} linears {program['in']} -> {program['out']}{' with bias' if program['bias'] else ''}"


def unmergeable(mods: list[Any]) -> str | None:
    """Why these linears cannot share one stacked weight, or None."""
    if any(not is_linear(m) for m in mods):
        return "not all are nn.Linear with their own forward"
    prog = program_of(mods)
    if any(program_of([m]) | {"members": prog["members"]} != prog for m in mods):
        return "their input or output sizes or their biases differ"
    params = [p for m in mods for p in (m.weight, m.bias) if p is not None]
    if len({id(p) for p in params}) != len(params):
        return "they share a weight"
    if len({(p.dtype, p.device) for p in params}) != 1:
        return "their weights are not of one dtype on one device"
    if not params[0].dtype.is_floating_point:
        return f"their weights are {str(params[0].dtype).removeprefix('torch.')} (quantized), not floating point"
    if not all(owns_storage(p) for p in params):
        return "a weight shares its storage with another tensor (tied, or stacked by another rewrite)"
    return None


class Stacked:
    """The siblings' weights as one ``[members, out, in]`` tensor and their biases as one
    ``[members, out]`` (or none), each parameter pointed at its slice when ``repoint``."""

    def __init__(self, owners: list[tuple[Any, str]], *, repoint: bool) -> None:
        """``owners``: per sibling, (its parent module, its name there)."""
        import torch

        self.pins = pins = Pinned()
        mods = [pins.link(parent._modules, name) for parent, name in owners]
        w0 = mods[0].weight
        g, (n, k) = len(mods), w0.shape
        views = []
        with torch.no_grad():
            self.weight = torch.empty(g, n, k, dtype=w0.dtype, device=w0.device)
            self.bias = torch.empty(g, n, dtype=w0.dtype, device=w0.device) if mods[0].bias is not None else None
            for i, m in enumerate(mods):
                for name, dst in (("weight", self.weight[i]), ("bias", None if self.bias is None else self.bias[i])):
                    p = pins.link(m._parameters, name)
                    if dst is None:
                        continue
                    dst.copy_(p)
                    pins.params.append(p)
                    views.append(dst)
            if repoint:
                pins.repoint(views)
        self.wt = self.weight.transpose(1, 2)
        """``[members, in, out]``: the product's right operand (a view, made once)."""
        self.bias3 = self.bias.unsqueeze(1) if self.bias is not None else None
        """``[members, 1, out]``: the biases as the product adds them (a view, made once)."""

    def release(self) -> None:
        self.pins.release()
        self.weight = self.bias = self.wt = self.bias3 = None  # type: ignore[assignment]


def merged(x: "torch.Tensor", st: Stacked) -> list["torch.Tensor"]:
    """Every sibling's ``F.linear(x, weight, bias)`` in one batched product: ``x`` expanded (not
    copied) to ``[members, rows, in]``; each output contiguous, shaped ``[..., out]``."""
    import torch

    g, k, n = st.wt.shape
    xe = x.reshape(-1, k).expand(g, -1, -1)
    out = torch.baddbmm(st.bias3, xe, st.wt) if st.bias3 is not None else torch.bmm(xe, st.wt)
    return list(out.view(g, *x.shape[:-1], n).unbind(0))


def check(ys: list["torch.Tensor"], refs: list["torch.Tensor"]) -> str | None:
    """Why the product's outputs do not match the siblings' own (the evaluator's tolerance), or None."""
    for i, (y, r) in enumerate(zip(ys, refs, strict=True)):
        if y.shape != r.shape or y.dtype != r.dtype:
            return f"output {i} is not shaped as the linear's"
        bad = check_fold(y, r, i)
        if bad is not None:
            return bad
    return None


class MergeGuard(RewriteGuard):
    """One promoted merge card in one model: its status and what its calls must be."""

    kind = CardKind.MERGE


@dataclass(slots=True)
class _Pending:
    """A product's outputs not yet returned, and what a sibling's call must be to take one."""

    x: "weakref.ref[torch.Tensor]"
    version: int
    shape: Any
    stream: int
    versions: list[int]
    """Every sibling's parameters' version counters when the product was computed, in
    ``Group.flat`` order (sibling ``i``'s at ``Group.spans[i]``)."""
    outs: list[Any]
    left: set[int]


class Group:
    """One set of siblings in one model, served by its card.

    A sibling's output depends on its own weight and bias alone, so each call checks those (the
    same objects in the linear, their data where the install put it, and for a stored output
    their versions then) rather than the whole set's."""

    def __init__(self, guard: MergeGuard, mods: list[Any], stacked: Stacked) -> None:
        import torch

        self.guard = guard
        self.originals: list[Callable[..., Any]] = [m.forward for m in mods]
        self.stacked = stacked
        self.k = int(mods[0].in_features)
        self.cuda = guard.device == "cuda"
        self.devtype = guard.device
        self.params: list[list[tuple[dict[str, Any], str, Any, int]]] = [
            [(m._parameters, n, m._parameters[n], m._parameters[n].data_ptr())
             for n in ("weight", "bias") if m._parameters.get(n) is not None] for m in mods]
        """Per sibling: (its parameters' dict, a name, the parameter installed, its data pointer)."""
        self.flat = [q for ps in self.params for _, _, q, _ in ps]
        """Every sibling's parameters, in order: their version counters are read in one pass."""
        self.spans: list[tuple[int, int]] = []
        at = 0
        for ps in self.params:
            self.spans.append((at, at + len(ps)))
            at += len(ps)
        self.checked = False
        self.products = 0
        self._local = threading.local()
        self._grad = torch.is_grad_enabled
        self._autocast = torch.is_autocast_enabled

    def _stream(self, x: Any) -> int:
        if not self.cuda:
            return 0
        import torch

        return int(torch._C._cuda_getCurrentRawStream(x.get_device()))

    def _own(self, i: int) -> bool:
        """Whether sibling ``i`` still holds the parameters installed, with their data in place."""
        return all(p.data_ptr() == ptr and d.get(n) is p for d, n, p, ptr in self.params[i])

    def _unchanged(self, i: int, versions: list[int]) -> bool:
        """``_own(i)``, and its parameters still at ``versions`` (all siblings', flat)."""
        at = self.spans[i][0]
        for j, (d, n, q, ptr) in enumerate(self.params[i]):
            if q._version != versions[at + j] or q.data_ptr() != ptr or d.get(n) is not q:
                return False
        return True

    def why_not(self, i: int, args: tuple, kwargs: dict) -> str | None:

        g = self.guard
        if kwargs or len(args) != 1:
            return "called with other arguments than the input"
        x = args[0]
        why = g.input_mismatch(x)
        if why is not None:
            return why
        if x.dim() == 0 or x.shape[-1] != self.k:
            return f"input size {x.shape[-1] if x.dim() else 'of a scalar'}"
        if x.is_inference():
            return "an inference tensor (no version counter to prove it unchanged between the calls)"
        if self._grad() and (x.requires_grad or any(p.requires_grad for _, _, p, _ in self.params[i])):
            return "gradients are needed"
        if self._autocast(self.devtype):
            return "autocast is on"
        if not self._own(i):
            return "a linear or its weight was replaced since the install"
        return None

    def call(self, i: int, args: tuple, kwargs: dict) -> Any:
        g = self.guard
        st = g.status
        p = getattr(self._local, "pending", None)
        if p is not None and st.active and len(args) == 1 and not kwargs and i in p.left:
            x = args[0]
            # the stored output is this call's only for the very tensor, unchanged, on the same
            # stream, the sibling's own weights as they were, no gradient or autocast wanted since
            if p.x() is x and x._version == p.version and x.shape == p.shape and self._unchanged(i, p.versions) \
                    and (not self.cuda or p.stream == self._stream(x)) \
                    and not self._grad() and not self._autocast(self.devtype):
                p.left.discard(i)
                y, p.outs[i] = p.outs[i], None
                if not p.left:
                    self._local.pending = None
                g.board.served(st)
                return y
        return self._compute(i, args, kwargs)

    def _compute(self, i: int, args: tuple, kwargs: dict) -> Any:
        import torch

        g = self.guard
        st = g.status
        if not st.active:
            g.board.fell_back(st, "disabled")
            return self.originals[i](*args, **kwargs)
        why = self.why_not(i, args, kwargs)
        if why is not None:
            g.board.fell_back(st, why)
            return self.originals[i](*args, **kwargs)
        x = args[0]
        self.products += 1
        check_now = not self.checked or (g.shadow_every > 0 and self.products % g.shadow_every == 0)
        if check_now and self.cuda and torch.cuda.is_current_stream_capturing():
            g.board.fell_back(st, "not checked yet (in a CUDA graph capture)")
            return self.originals[i](*args, **kwargs)
        try:
            outs = merged(x, self.stacked)
        except (RuntimeError, ValueError, TypeError) as exc:
            g.board.disable(st, f"batched product error: {exc}")
            g.board.fell_back(st, "batched product error")
            return self.originals[i](*args, **kwargs)
        if check_now:
            refs = [f(x) for f in self.originals]
            first, self.checked = not self.checked, True
            if not g.board.checked(st, check(outs, refs), first):
                return refs[i]
        self._local.pending = _Pending(weakref.ref(x), x._version, x.shape, self._stream(x),
                                       # each sibling's parameters' own version counters (an in-place change
                                       # through a parameter counts on it, not on the stacked tensor it views)
                                       [q._version for q in self.flat], outs, set(range(len(outs))) - {i})
        g.board.served(st)
        return outs[i]


class Member:
    """A sibling's forward: its group's call for sibling ``i``."""

    __slots__ = ("group", "i")

    def __init__(self, group: Group, i: int) -> None:
        self.group = group
        self.i = i

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.group.call(self.i, args, kwargs)


def groups_of(entry: Any) -> list[list[str]]:
    """The card's sets of siblings: its module paths, ``members`` at a time."""
    n = int(entry.signature.program["members"])
    paths = entry.signature.module_paths
    return [paths[i:i + n] for i in range(0, len(paths), n)]


def _owner(model: Any, path: str) -> tuple[Any, str]:
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def install(applied: Any, model: "torch.nn.Module", entries: list[Any], device: str, shadow_every: int) -> None:
    """Serve the merge cards ``entries`` in ``model``: each set of siblings a card names gets its
    stacked weights and each sibling the guarded forward (``applied``'s replaced forwards, undone
    with it, its weights given their own storage again); a set not found here, or no longer
    mergeable, is skipped with why."""
    import torch

    for e in entries:
        prog = e.signature.program
        guard = MergeGuard(e.card, e.signature.target, getattr(torch, e.signature.inputs[0].dtype), device,
                           applied.board, shadow_every, prog)
        why: list[str] = []
        for paths in groups_of(e):
            try:
                owners = [_owner(model, p) for p in paths]
                mods = [parent._modules[name] for parent, name in owners]
            except (AttributeError, KeyError):
                why.append(f"{paths[0]}: not in this model")
                continue
            bad = unmergeable(mods) or (None if program_of(mods) == prog else "not the card's linears")
            if bad:
                why.append(f"{', '.join(paths)}: {bad}")
                continue
            stacked = Stacked(owners, repoint=True)
            group = Group(guard, mods, stacked)
            for i, m in enumerate(mods):
                applied._replace_forward(m, Member(group, i))
            applied.on_undo(stacked.release)
            guard.status.sites.append(" + ".join(paths))
        if guard.status.sites:
            applied.merges[e.card] = guard
        else:
            applied.skipped[e.card] = "none of its sibling sets is served in this model: " + "; ".join(why[:3])
