"""Batch norms folded into the convolution before them: inference's cheapest kernel is none.

In inference a batch norm is a per-channel affine map, ``y = (x - mean) / sqrt(var + eps) * w +
b``, and where its input is a convolution's output and nothing else reads that output, the map
folds into the convolution's weight and bias (``torch.nn.utils.fusion.fuse_conv_bn_weights``):
the convolution then computes the batch norm's output itself, and the batch norm's pass over the
activations, its launch and its module call are gone. On the H200, a ResNet-50 fp16 forward
(batch 32) ran 1.51x faster in eager with its 53 batch norms folded (``bench/lab/
resnet_fold_probe.py``), where serving each batch norm with a faster kernel had reached 1.13x at
best, since the forward is bound by the host's calls.

Where they fold is read from the code, never guessed: the forward of the module that calls both
(the parent) is traced by ``torch.fx`` with every child a leaf, and a pair folds only where the
convolution's output node has one user, the batch norm, called on it alone. The parent's forward
is then that traced graph with the pair's two calls replaced by one call of a ``Fold``; the rest
of the graph calls the same children, as the forward did. A parent whose forward does not trace
(data-dependent control flow) keeps its forward and its pairs are not folded.

Every call is guarded, and falls back to the pair's own two calls (hooks and all) where the fold
would not compute what they do: gradients needed, the batch norm in training mode, forward hooks
on either module, another device or dtype than the card's, or the parent's children replaced or
its training flag changed since the trace. Weights or statistics changed in place (a load, a
fine-tune) are refolded before the next call, by their version counters. Shapes are not guarded:
the folded convolution is PyTorch's own convolution, exact for any shape. A pair's first served
call (and every ``shadow_every``-th) is computed both ways and compared within the evaluator's
tolerance; a mismatch, or an error, disables the card and that call returns the pair's own value.

This is the runtime's half of the fold rewrite: ``kinds/fold.py`` installs its cards, and
``forge_tui/rewrites/fold.py`` (``forge fold``) proposes, checks, times and promotes them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..cards import CardKind
from ..compare import compare
from . import epilogue as _epilogue

if TYPE_CHECKING:
    import torch

    from .status import CardStatus, StatusBoard

FOLD_FILE = "fold.json"


def _pairs_of_types() -> tuple[tuple[type, type], ...]:
    from torch import nn

    return ((nn.Conv1d, nn.BatchNorm1d), (nn.Conv2d, nn.BatchNorm2d), (nn.Conv3d, nn.BatchNorm3d))


@dataclass(frozen=True)
class Pair:
    """A convolution whose output only its batch norm reads, in ``parent``'s forward. ``conv`` and
    ``bn`` are the calls' targets, relative to the parent."""

    parent: str
    conv: str
    bn: str
    node: str
    """The convolution's node in the parent's traced graph."""

    def path(self, rel: str) -> str:
        return f"{self.parent}.{rel}" if self.parent else rel

    @property
    def conv_path(self) -> str:
        return self.path(self.conv)

    @property
    def bn_path(self) -> str:
        return self.path(self.bn)


def _leaf_tracer() -> Any:
    import torch.fx

    class OwnForward(torch.fx.Tracer):
        """Traces one module's own forward: every module it calls is a leaf."""

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return True

    return OwnForward()


def trace_own(module: "torch.nn.Module") -> tuple[Any | None, str]:
    """The graph of ``module``'s own forward (children as leaves), or None and why not."""
    try:
        return _leaf_tracer().trace(module), ""
    except Exception as exc:  # noqa: BLE001 - any failure to trace means: not folded here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"its forward does not trace ({type(exc).__name__}: {first[:160]})"


def foldable(conv: Any, bn: Any) -> str | None:
    """Why this convolution and batch norm cannot fold (their kinds, shapes, modes), or None."""
    kinds = [(c, b) for c, b in _pairs_of_types() if type(conv) is c and type(bn) is b]
    if not kinds:
        return f"{type(conv).__name__} and {type(bn).__name__} are not a convolution and its batch norm"
    if conv.padding_mode != "zeros":
        return f"padding mode {conv.padding_mode}"
    if bn.running_mean is None or bn.running_var is None:
        return "the batch norm keeps no running statistics (it normalises by the batch's)"
    if bn.num_features != conv.out_channels:
        return f"{bn.num_features} features after {conv.out_channels} channels"
    return None


def pairs_in(parent: "torch.nn.Module", path: str, graph: Any) -> list[Pair]:
    """The foldable pairs of a traced own-forward graph."""
    out = []
    for node in graph.nodes:
        if node.op != "call_module" or len(node.users) != 1:
            continue
        user = next(iter(node.users))
        if user.op != "call_module" or user.args != (node,) or user.kwargs or len(node.kwargs) or len(node.args) != 1:
            continue
        try:
            conv, bn = parent.get_submodule(node.target), parent.get_submodule(user.target)
        except AttributeError:
            continue
        if foldable(conv, bn) is None:
            out.append(Pair(path, node.target, user.target, node.name))
    return out


def find_pairs(model: "torch.nn.Module") -> tuple[list[Pair], dict[str, str]]:
    """Every foldable pair in ``model``, and why each module with a batch norm child yields none."""
    bns = tuple(b for _, b in _pairs_of_types())
    pairs: list[Pair] = []
    why: dict[str, str] = {}
    for path, m in model.named_modules():
        if not any(isinstance(c, bns) for c in m.children()):
            continue
        graph, reason = trace_own(m)
        if graph is None:
            why[path] = reason
            continue
        found = pairs_in(m, path, graph)
        if found:
            pairs.extend(found)
        else:
            why[path] = "no convolution there feeds only its batch norm"
    return pairs, why


def conv_config(conv: Any) -> dict[str, Any]:
    return {"type": type(conv).__name__, "in": conv.in_channels, "out": conv.out_channels,
            "kernel": list(conv.kernel_size), "stride": list(conv.stride),
            "padding": conv.padding if isinstance(conv.padding, str) else list(conv.padding),
            "dilation": list(conv.dilation), "groups": conv.groups, "bias": conv.bias is not None}


def bn_config(bn: Any) -> dict[str, Any]:
    return {"type": type(bn).__name__, "eps": bn.eps, "affine": bn.affine}


def fold_program(conv: Any, bn: Any) -> dict[str, Any]:
    """What a fold card's signature records as its program: the two modules' configurations."""
    return {"fold": {"conv": conv_config(conv), "bn": bn_config(bn)}}


def fold_target(conv: Any, bn: Any) -> str:
    """A fold card's target: ``Conv2d+BatchNorm2d`` and the like."""
    return f"{type(conv).__name__}+{type(bn).__name__}"


def fold_card_id(conv: Any, bn: Any, spec: dict[str, Any]) -> str:
    key = json.dumps({"program": fold_program(conv, bn), "input": spec}, sort_keys=True)
    return f"fold-{fold_target(conv, bn)}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def folded_params(conv: Any, bn: Any, dtype: Any) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The convolution's weight and bias with the batch norm folded in, computed in float32 (in
    ``dtype``), not tracked by autograd."""
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    def f(t: Any) -> Any:
        return None if t is None else t.detach().float()

    with torch.no_grad(), torch.inference_mode(False):
        w, b = fuse_conv_bn_weights(f(conv.weight), f(conv.bias), f(bn.running_mean), f(bn.running_var), bn.eps,
                                    f(bn.weight), f(bn.bias))
        return w.detach().to(dtype), b.detach().to(dtype)


def pair_reference(conv: Any, bn: Any, x: "torch.Tensor") -> "torch.Tensor":
    """What the pair computes, by its classes' own forwards (no replaced forward, no hook)."""
    return type(bn).forward(bn, type(conv).forward(conv, x))


def check_fold(y: "torch.Tensor", ref: "torch.Tensor", index: int = 0) -> str | None:
    """Why the folded output (output ``index`` of a rewrite) does not match the model's own (the
    evaluator's tolerance for the dtype, relative to the reference's root mean square), or None."""
    scale = float(ref.float().pow(2).mean().sqrt()) if ref.numel() else 1.0
    m = compare(y, ref, index, scale=scale or 1.0)
    return None if m is None else str(m)


class RewriteGuard:
    """One promoted card of a rewrite (fold, experts, merge) in one model: its status on the
    board, the dtype and device of its calls, its shadow checks."""

    kind: CardKind

    def __init__(self, card: str, target: str, dtype: Any, device: str, board: "StatusBoard",
                 shadow_every: int, program: dict[str, Any] | None = None) -> None:
        self.card = card
        self.program = program or {}
        self.dtype = dtype
        self.device = device
        self.board = board
        self.status: "CardStatus" = board.card(card, self.kind, target)
        self.shadow_every = shadow_every

    def input_mismatch(self, x: Any) -> str | None:
        """Why ``x`` is not an input of this card's calls (a plain tensor of its device and
        dtype), or None."""
        import torch

        if type(x) is not torch.Tensor:
            return "the input is not a plain tensor"
        if x.device.type != self.device:
            return f"device {x.device.type}"
        if x.dtype is not self.dtype:
            return f"dtype {str(x.dtype).removeprefix('torch.')}"
        return None


class FoldGuard(RewriteGuard):
    kind = CardKind.FOLD


def hooked(*mods: Any) -> bool:
    """Whether forward hooks (any module's, or global ones) would run around these modules' calls."""
    from torch.nn.modules import module as mm

    if mm._global_forward_hooks or mm._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in mods)


class Fold:
    """One pair in one model, called from its parent's rewritten forward in the pair's place."""

    def __init__(self, guard: FoldGuard, conv: Any, bn: Any, relu: Any = None) -> None:
        self.guard = guard
        self.conv = conv
        self.bn = bn
        self.relu = relu
        """The ReLU module after the pair, where the forward applies one (``run_relu``)."""
        self.epilogue = ""
        """What the fold finishes after the pair ("ReLU", "residual sum and ReLU"; ``rewrite``)."""
        self._key: list | None = None
        self._params: tuple[Any, Any] | None = None
        self._checked = False
        self._calls = 0
        # the modules' own dicts, read per call without nn.Module.__getattr__
        self._cp, self._bp, self._bb = conv._parameters, bn._parameters, bn._buffers

    def _tensors(self) -> list[Any]:
        cp, bp, bb = self._cp, self._bp, self._bb
        return [cp.get("weight"), cp.get("bias"), bp.get("weight"), bp.get("bias"), bb.get("running_mean"),
                bb.get("running_var")]

    def why_not(self, x: Any) -> str | None:
        import torch

        why = self.guard.input_mismatch(x)
        if why is not None:
            return why
        if self.bn.training:
            return "the batch norm is in training mode"
        if torch.is_grad_enabled() and (x.requires_grad or any(t is not None and t.requires_grad for t in self._tensors())):
            return "gradients are needed"
        if hooked(self.conv, self.bn):
            return "forward hooks on the pair"
        return None

    def params(self, dtype: Any) -> tuple[Any, Any]:
        """The folded weight and bias, folded again when a weight or statistic changed."""
        try:
            key: list | None = [(t, t._version) if t is not None else None for t in self._tensors()]
            key.append(self.bn.eps)  # type: ignore[union-attr]
        except RuntimeError:  # inference tensors keep no version: fold on every call
            key = None
        if key is None or self._params is None or not _same(key, self._key):
            self._params = folded_params(self.conv, self.bn, dtype)
            self._key = key
        return self._params

    def run(self, x: Any) -> Any:
        """The pair's output: the batch norm's of the convolution's."""
        return self._serve(x, None, False)

    def run_relu(self, x: Any) -> Any:
        """``relu(bn(conv(x)))``, the ReLU module ``self.relu``'s (an epilogue: ``epilogue.py``)."""
        return self._serve(x, None, True)

    def run_add_relu(self, x: Any, z: Any) -> Any:
        """``relu(bn(conv(x)) + z)``."""
        return self._serve(x, z, True)

    def _own(self, x: Any, z: Any, relu: bool) -> Any:
        """What the forward computes there, by the modules' own calls."""
        y = self.bn(self.conv(x))
        if z is not None:
            y = y + z
        return self.relu(y) if relu else y

    def _serve(self, x: Any, z: Any, relu: bool) -> Any:
        import torch

        g = self.guard
        st = g.status
        if not st.active:
            g.board.fell_back(st, "disabled")
            return self._own(x, z, relu)
        why = self.why_not(x)
        if why is None and relu:
            if hooked(self.relu):
                why = "forward hooks on the ReLU"
            elif z is not None and (type(z) is not torch.Tensor or z.requires_grad and torch.is_grad_enabled()):
                why = "the residual is not a plain tensor"
        if why is not None:
            g.board.fell_back(st, why)
            return self._own(x, z, relu)
        self._calls += 1
        check = not self._checked or (g.shadow_every > 0 and self._calls % g.shadow_every == 0)
        if check and g.device == "cuda" and torch.cuda.is_current_stream_capturing():
            # a comparison synchronises, which a capture forbids
            g.board.fell_back(st, "not checked yet (in a CUDA graph capture)")
            return self._own(x, z, relu)
        try:
            w, b = self.params(x.dtype)
            if relu:
                y = self.conv._conv_forward(x, w, None)
                if z is not None and (z.shape != y.shape or z.dtype != y.dtype or z.device != y.device):
                    # the sum would broadcast or promote: the forward's own ops do that
                    g.board.fell_back(st, "the residual is not of the output's shape and dtype")
                    return self._own(x, z, relu)
                y = _epilogue.finish(y, b, z)
            else:
                y = self.conv._conv_forward(x, w, b)
        except (RuntimeError, ValueError, TypeError) as exc:
            g.board.disable(st, f"fold error: {exc}")
            g.board.fell_back(st, "fold error")
            return self._own(x, z, relu)
        if check:
            ref = pair_reference(self.conv, self.bn, x)
            if z is not None:
                ref = ref + z
            if relu:
                ref = torch.relu(ref)
            first, self._checked = not self._checked, True
            if not g.board.checked(st, check_fold(y, ref), first):
                return ref
        g.board.served(st)
        return y


def _same(key: list, old: list | None) -> bool:
    """Whether two keys (tensor and version, or None, then eps) name the same values: tensors by
    identity (``==`` on tensors would compare their elements)."""
    if old is None or len(key) != len(old):
        return False
    for a, b in zip(key[:-1], old[:-1]):
        if a is None or b is None:
            if a is not b:
                return False
        elif a[0] is not b[0] or a[1] != b[1]:
            return False
    return key[-1] == old[-1]


def rewrite(parent: "torch.nn.Module", graph: Any, folds: dict[str, Fold], epilogues: bool = False) -> Callable[..., Any]:
    """``parent``'s forward as its traced graph with each pair (by its convolution's node name,
    ``folds``) replaced by its Fold: a callable with the forward's arguments. ``epilogues``: a
    ReLU after the pair, and a sum before it, go into the Fold too (``epilogue.py``; where,
    ``epilogue.used``): on the H200 a ResNet-50 forward ran 1.454x eager in graphs with them and
    1.100x without, but op by op with the Triton kernel 1.121x, against 1.289x without, its launch
    costing the host more than the ops it replaces (bench/lab/fold_epilogue_ab.py)."""
    import torch.fx

    g = torch.fx.Graph()
    env: dict[Any, Any] = {}
    out = g.graph_copy(graph, env)
    g.output(out)
    by_name = {n.name: env[n] for n in graph.nodes if n in env}
    root: dict[str, Any] = {}
    for k, (name, fold) in enumerate(folds.items()):
        conv_node = by_name[name]
        bn_node = next(iter(conv_node.users))
        attr = f"_forge_fold_{k}"
        root[attr] = fold
        tail, relu_node, z = _epilogue_of(parent, bn_node) if epilogues else ([], None, None)
        fold.relu = None if relu_node is None else parent.get_submodule(relu_node.target)
        fold.epilogue = "" if relu_node is None else "ReLU" if z is None else "residual sum and ReLU"
        last = relu_node if relu_node is not None else bn_node
        with g.inserting_before(last):
            holder = g.get_attr(attr)
            if relu_node is None:
                call = g.call_method("run", (holder, conv_node.args[0]))
            elif z is None:
                call = g.call_method("run_relu", (holder, conv_node.args[0]))
            else:
                call = g.call_method("run_add_relu", (holder, conv_node.args[0], z))
        last.replace_all_uses_with(call)
        for node in reversed([conv_node, bn_node] + tail):
            g.erase_node(node)
    for node in g.nodes:
        if node.op in ("call_module", "get_attr") and node.target not in root:
            root[node.target] = _attr(parent, node.target)
    gm = torch.fx.GraphModule(root, g, class_name=f"Folded{type(parent).__name__}")
    return gm.forward


def _epilogue_of(parent: Any, bn_node: Any) -> tuple[list[Any], Any, Any]:
    """What the forward does with a pair's output that the fold can finish in the same pass
    (``epilogue.py``): a ReLU module on it alone, or on its sum with one other value, that sum's
    only reader. Returns (the nodes after the batch norm's that go, the ReLU's node, the other
    summand), or ([], None, None)."""
    import operator

    from torch import nn

    def relu_of(node: Any) -> Any:
        if len(node.users) != 1:
            return None
        u = next(iter(node.users))
        ok = (u.op == "call_module" and u.args == (node,) and not u.kwargs
              and type(_attr(parent, u.target)) is nn.ReLU)
        return u if ok else None

    r = relu_of(bn_node)
    if r is not None:
        return [r], r, None
    if len(bn_node.users) != 1:
        return [], None, None
    add = next(iter(bn_node.users))
    if add.op == "call_function" and add.target in (operator.add, operator.iadd) and len(add.args) == 2 \
            and not add.kwargs and (add.args[0] is bn_node) != (add.args[1] is bn_node):
        z = add.args[1] if add.args[0] is bn_node else add.args[0]
        r = relu_of(add)
        if r is not None and isinstance(z, type(bn_node)):
            return [add, r], r, z
    return [], None, None


def _attr(obj: Any, target: str) -> Any:
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def guarded_forward(parent: "torch.nn.Module", folded: Callable[..., Any], original: Callable[..., Any],
                    guards: list[FoldGuard]) -> Callable[..., Any]:
    """The parent's forward: the folded graph while the parent is as it was traced (the same
    children, the same training flag), else its original forward, counted as a fallback."""
    children = list(parent._modules.items())
    training = parent.training

    def forward(*args: Any, **kwargs: Any) -> Any:
        mods = parent._modules
        if parent.training is training and len(mods) == len(children) and \
                all(mods.get(k) is v for k, v in children):
            return folded(*args, **kwargs)
        for g in guards:
            g.board.fell_back(g.status, "the module changed since the fold was installed")
        return original(*args, **kwargs)

    return forward


def install(applied: Any, model: "torch.nn.Module", entries: list[Any], device: str, shadow_every: int,
            graphs: bool) -> None:
    """Serve the fold cards ``entries`` in ``model``: each parent whose forward calls one of their
    pairs gets its rewritten forward (``applied``'s replaced forwards, undone with it); a card none
    of whose pairs is found here is skipped with why."""
    import torch

    epilogues = _epilogue.used(device, graphs)
    want: dict[str, Any] = {}
    for e in entries:
        for path in e.signature.module_paths:
            want.setdefault(path, e)
    parents = sorted({p for path in want for p in _ancestors(path)}, key=lambda p: -p.count("."))
    guards: dict[str, FoldGuard] = {}
    why: dict[str, str] = {}
    done: set[str] = set()
    for path in parents:
        if not any(b not in done and path in _ancestors(b) for b in want):
            continue  # every pair below it is found already
        try:
            parent = model.get_submodule(path) if path else model
        except AttributeError:
            continue
        if "forward" in parent.__dict__:
            why[path] = "its forward is replaced already (forge serves it, or the caller set one)"
            continue
        graph, reason = trace_own(parent)
        if graph is None:
            why[path] = reason
            continue
        mine = [p for p in pairs_in(parent, path, graph) if p.bn_path in want and p.bn_path not in done]
        good = []
        for p in mine:
            e = want[p.bn_path]
            conv, bn = parent.get_submodule(p.conv), parent.get_submodule(p.bn)
            if fold_program(conv, bn) != e.signature.program:
                why[p.bn_path] = "its convolution or batch norm is not configured as the card's"
                continue
            good.append(p)
            done.add(p.bn_path)
        if not good:
            continue
        folds: dict[str, Fold] = {}
        mine_guards: list[FoldGuard] = []
        for p in good:
            e = want[p.bn_path]
            g = guards.get(e.card)
            if g is None:
                g = guards[e.card] = FoldGuard(e.card, e.signature.target, getattr(torch, e.signature.inputs[0].dtype),
                                               device, applied.board, 0 if graphs else shadow_every)
            g.status.sites.append(p.bn_path)
            folds[p.node] = Fold(g, parent.get_submodule(p.conv), parent.get_submodule(p.bn))
            if g not in mine_guards:
                mine_guards.append(g)
        original = parent.forward
        applied._replace_forward(parent, guarded_forward(parent, rewrite(parent, graph, folds, epilogues), original,
                                                         mine_guards))
        for p in good:
            fold = folds[p.node]
            if fold.relu is not None:
                sites = fold.guard.status.sites
                sites[sites.index(p.bn_path)] = f"{p.bn_path} (with its {fold.epilogue}: {_epilogue.way(device)})"
    for e in entries:
        if e.card in guards:
            applied.folds[e.card] = guards[e.card]
        else:
            reasons = sorted({why[k] for k in why if any(k == b or k in _ancestors(b) for b in e.signature.module_paths)})
            applied.skipped[e.card] = ("none of its pairs is in this model: " + ", ".join(e.signature.module_paths[:3])
                                       + (f" ({'; '.join(reasons[:2])})" if reasons else ""))


def _ancestors(path: str) -> list[str]:
    """The modules above ``path``, nearest first, the root ("") last."""
    parts = path.split(".")
    return [".".join(parts[:k]) for k in range(len(parts) - 1, -1, -1)]
