"""Routed experts in one grouped pass: a mixture-of-experts block without its Python loop.

Hugging Face's eager mixture-of-experts blocks (Qwen-MoE, Mixtral, OLMoE and the bundled ``moe``
example) route each token to its top-k experts and then loop over the experts in Python: per
expert hit, a ``torch.where``, a gather, three linears, an activation, a scaling and an
``index_add_``, after a ``nonzero().tolist()`` that makes the host wait for the device. On the
H200 the bundled ``moe`` example spent 70% of its 85 ms forward in that Python (the ninth
session's timeline), and no kernel for a leaf module or op can remove it.

Here the block's forward is computed in a fixed number of launches that never wait for the
device: the router's linear, softmax and top-k as the block does them; the (token, slot) pairs
sorted by expert (a stable argsort) with each expert's count summed on the device; the tokens
gathered once; the gate and up projections of every expert in one grouped matrix product
(``torch._grouped_mm``, PyTorch's CUTLASS grouped GEMM on Hopper), the activation and the
product, the down projection in a second grouped product; each row scaled by its routing weight;
and the k rows of each token added in ascending expert order, rounding to the dtype after each
add, as the block's ``index_add_`` loop does. Every other op is the one the block calls, so the
result differs from the block's only by the grouped products' summation order.

A grouped product reads each layer's experts as one ``[experts, rows, cols]`` tensor. Installing
moves each block's expert weights into such tensors and points every expert's parameter at its
slice (``param.data = view``): the same values, the same ``Parameter`` objects, no second copy.
Loading weights in place writes through the views; undoing gives every parameter its own storage
again.

Which modules are such blocks is read from their structure and then proven by their output: a
module with a ``gate`` (or ``router``: Jamba) linear to E outputs, an ``experts`` module list of E
gated MLPs (linears ``gate_proj``/``up_proj``/``down_proj`` or ``w1``/``w3``/``w2``, no bias), a ``top_k`` (or
``num_experts_per_tok``) and no other child with weights but a shared expert with its sigmoid
gate (``shared_expert`` and ``shared_expert_gate``, a linear to one output: Qwen2-MoE), which the
grouped pass calls and adds as the block does. The activation is found by calling one expert
(SiLU, tanh-GELU, GELU or ReLU, the one that reproduces it exactly), and whether the top-k weights
are renormalised by ``norm_topk_prob`` where the block has it, else by the block's output. A card
is promoted only where its output matches the block's own on the captured input and on a random
one (``forge_tui/rewrites/experts.py``: ``forge experts``).

Every call is guarded and falls back to the block's own forward (hooks and all) where the grouped
pass would not compute what it does: gradients needed, the block in training mode, forward hooks
on it or any child, another device, dtype, number of dims or hidden size than the card's, another
call signature, or an expert's weight no longer the stacked slice (a parameter replaced). The first served call
(and every ``shadow_every``-th) is checked against the block's own forward; a mismatch or an
error disables the card and that call returns the block's own value.

This is the runtime's half of the experts rewrite: ``kinds/experts.py`` installs its cards, and
``forge_tui/rewrites/experts.py`` (``forge experts``) proposes, checks, times and promotes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..cards import CardKind
from .fold import RewriteGuard, check_fold, hooked
from .pinned import Pinned

if TYPE_CHECKING:
    import torch

    from .status import StatusBoard

EXPERTS_FILE = "experts.json"
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")
PROJECTIONS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
ROUTERS = ("gate", "router")
"""The router linear's names (``router``: Jamba)."""
"""An expert's linears by name: gate, up, down (Llama-style, Mixtral-style)."""


@dataclass(frozen=True)
class Block:
    """A routed-experts module found in a model: its path and what its structure fixes."""

    path: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    names: tuple[str, str, str]
    act: str
    norm: bool | None
    """``norm_topk_prob`` where the block has it; None: decided by the block's output."""
    router: str = "gate"
    """The router linear's name: ``gate``, or ``router`` (Jamba)."""
    shared: bool = False
    """A shared expert every token also goes through, scaled by a sigmoid gate (Qwen2-MoE):
    ``+ sigmoid(shared_expert_gate(x)) * shared_expert(x)``."""

    def program(self, norm: bool, returns: str) -> dict[str, Any]:
        out = {"experts": self.experts, "top_k": self.top_k, "hidden": self.hidden,
               "intermediate": self.intermediate, "names": list(self.names), "act": self.act, "norm": norm,
               "returns": returns}
        if self.shared:
            out["shared"] = True
        if self.router != "gate":
            out["router"] = self.router
        return out


def _linear_ok(m: Any, out_f: int | None, in_f: int | None) -> bool:
    import torch

    return (isinstance(m, torch.nn.Linear) and m.bias is None and (out_f is None or m.out_features == out_f)
            and (in_f is None or m.in_features == in_f))


def activation(name: str) -> Callable[[Any], Any]:
    import torch.nn.functional as F

    return {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu": F.gelu,
            "relu": F.relu}[name]


def _expert_act(expert: Any, names: tuple[str, str, str], hidden: int) -> str | None:
    """The activation that makes ``down(act(gate(x)) * up(x))`` the expert's own output, bit for bit."""
    import torch

    p = expert.get_submodule(names[0]).weight
    gen = torch.Generator(device=p.device).manual_seed(0)
    x = torch.randn(4, hidden, generator=gen, device=p.device, dtype=torch.float32).to(p.dtype)
    g, u, d = (expert.get_submodule(n) for n in names)
    with torch.no_grad():
        try:
            want = expert(x)
        except Exception:  # noqa: BLE001 - an expert with another call signature: not a gated MLP
            return None
        if not isinstance(want, torch.Tensor):
            return None
        for name in ACTIVATIONS:
            if torch.equal(d(activation(name)(g(x)) * u(x)), want):
                return name
    return None


def find_blocks(model: "torch.nn.Module") -> tuple[list[Block], dict[str, str]]:
    """The routed-experts blocks of ``model``, and why each module that looks like one (a
    ``gate`` and an ``experts`` child) is not."""
    import torch

    blocks: list[Block] = []
    why: dict[str, str] = {}
    for path, m in model.named_modules():
        kids = m._modules
        router = next((r for r in ROUTERS if r in kids), None)
        if router is None or "experts" not in kids:
            continue
        gate, experts = kids[router], kids["experts"]
        if not isinstance(experts, torch.nn.ModuleList) or len(experts) == 0:
            fused = isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor) and experts.gate_up_proj.dim() == 3
            why[path] = ("its experts are stored fused, [experts, rows, cols] (transformers 5's layout, which runs them "
                         "grouped by default: experts_implementation='grouped_mm')" if fused
                         else "its experts are not a ModuleList")
            continue
        others = sorted(k for k in kids if k not in (router, "experts") and kids[k] is not None
                        and any(True for _ in kids[k].parameters()))
        shared = others == ["shared_expert", "shared_expert_gate"] and _linear_ok(kids["shared_expert_gate"], 1, None)
        if others and not shared:
            why[path] = f"it has children besides the router and the experts: {', '.join(others)}" + (
                " (a shared expert is served with a linear gate to one output, shared_expert_gate)"
                if "shared_expert" in others else "")
            continue
        n = len(experts)
        if not _linear_ok(gate, n, None):
            why[path] = f"its gate is not a linear without bias to its {n} experts"
            continue
        top_k = getattr(m, "top_k", None)
        if top_k is None:
            top_k = getattr(m, "num_experts_per_tok", None)
        if not isinstance(top_k, int) or not 0 < top_k <= n:
            why[path] = "it has no top_k (or num_experts_per_tok) between 1 and its number of experts"
            continue
        hidden = gate.in_features
        first = experts[0]
        names = next((ns for ns in PROJECTIONS if all(k in first._modules for k in ns)), None)
        if names is None:
            why[path] = "its experts are not gated MLPs (gate_proj, up_proj, down_proj or w1, w3, w2)"
            continue
        inter = int(getattr(first._modules[names[0]], "out_features", 0))
        hidden = int(hidden)
        dtypes = {p.dtype for p in m.parameters()}
        devices = {p.device for p in m.parameters()}
        bad = ""
        for k, e in enumerate(experts):
            lin = [e._modules.get(nm) for nm in names]
            if type(e) is not type(first) or not (_linear_ok(lin[0], inter, hidden) and _linear_ok(lin[1], inter, hidden)
                                                  and _linear_ok(lin[2], hidden, inter)):
                bad = f"expert {k} is not shaped as expert 0 (linears without bias, {hidden} -> {inter} -> {hidden})"
                break
            extra = [c for c, sub in e._modules.items() if c not in names and sub is not None
                     and any(True for _ in sub.parameters())]
            if extra:
                bad = f"expert {k} has other children with weights: {', '.join(extra)}"
                break
        if bad:
            why[path] = bad
            continue
        if len(dtypes) != 1 or len(devices) != 1:
            why[path] = "its weights are not of one dtype on one device"
            continue
        if not next(iter(dtypes)).is_floating_point:
            why[path] = f"its weights are {str(next(iter(dtypes))).removeprefix('torch.')} (quantized), not floating point"
            continue
        act = _expert_act(first, names, hidden)
        if act is None:
            why[path] = f"its experts' forward is not down(act(gate(x)) * up(x)) for act in {', '.join(ACTIVATIONS)}"
            continue
        norm = getattr(m, "norm_topk_prob", None)
        if shared and kids["shared_expert_gate"].in_features != hidden:
            why[path] = "its shared expert's gate does not read the hidden states"
            continue
        blocks.append(Block(path, n, top_k, hidden, inter, names, act, norm if isinstance(norm, bool) else None,
                            router, shared))
    return blocks, why


def card_id(block: Block, program: dict[str, Any], spec: dict[str, Any]) -> str:
    key = json.dumps({"program": program, "input": spec}, sort_keys=True)
    return f"experts-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def target(block: Block) -> str:
    return f"{block.experts} experts top-{block.top_k} ({block.act})"


class Stacked:
    """A block's expert weights as two ``[experts, rows, cols]`` tensors: gate and up
    projections one above the other, ``[E, 2I, H]``, and down projections, ``[E, H, I]``
    (``pinned.Pinned``: each expert's weight pointed at its slice when ``repoint``)."""

    def __init__(self, block: Block, module: Any, *, repoint: bool) -> None:
        import torch

        experts = module._modules["experts"]
        g, u, d = block.names
        first = experts[0].get_submodule(g).weight
        E, H, I_ = block.experts, block.hidden, block.intermediate
        self.pins = pins = Pinned()
        views = []
        with torch.no_grad():
            self.gate_up = torch.empty(E, 2 * I_, H, dtype=first.dtype, device=first.device)
            self.down = torch.empty(E, H, I_, dtype=first.dtype, device=first.device)
            pins.size(experts._modules)
            for k in range(E):
                e = pins.link(experts._modules, str(k)) if str(k) in experts._modules else experts[k]
                for n, dst in zip((g, u, d), (self.gate_up[k, :I_], self.gate_up[k, I_:], self.down[k])):
                    lin = pins.link(e._modules, n)
                    p = pins.link(lin._parameters, "weight")
                    dst.copy_(p)
                    pins.params.append(p)
                    views.append(dst)
            if repoint:
                pins.repoint(views)

    @property
    def params(self) -> list[Any]:
        return self.pins.params

    def intact(self) -> bool:
        """Whether every expert weight the block has now is still its slice of the stacked tensors:
        not where an expert, a linear or a weight was replaced by another object, or a weight's
        data by other data."""
        return self.pins.intact()

    def release(self) -> None:
        """Give each parameter its own storage again (undo)."""
        self.pins.release()
        self.gate_up = self.down = None  # type: ignore[assignment]


def grouped_mm(a: "torch.Tensor", w: "torch.Tensor", offs: "torch.Tensor") -> "torch.Tensor":
    """``a[rows of group e] @ w[e].T`` for each group, rows grouped by ``offs`` (cumulative ends)."""
    import torch

    return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)


def routed(x: "torch.Tensor", gate_weight: "torch.Tensor", stacked: Stacked, block: Block, norm: bool,
           want_logits: bool, module: Any = None) -> Any:
    """The block's forward on ``x`` (``[..., hidden]``) in one grouped pass: no host sync.
    ``module``: the block, whose shared expert and its gate are called where it has them."""
    import torch
    import torch.nn.functional as F

    shape = x.shape
    E, k, I_ = block.experts, block.top_k, block.intermediate
    h = x.reshape(-1, block.hidden)
    n = h.shape[0]
    logits = F.linear(h, gate_weight)
    weights = F.softmax(logits, dim=1, dtype=torch.float)
    weights, chosen = torch.topk(weights, k, dim=-1)
    if norm:
        weights /= weights.sum(dim=-1, keepdim=True)
    weights = weights.to(h.dtype)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=h.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    rows = h.index_select(0, order // k)
    gu = grouped_mm(rows, stacked.gate_up, offs)
    act = activation(block.act)(gu[:, :I_]) * gu[:, I_:]
    out = grouped_mm(act, stacked.down, offs)
    out = out * weights.reshape(-1).index_select(0, order).unsqueeze(1)
    # each token's k rows, in ascending expert order (the block adds them expert by expert)
    rank = torch.argsort(torch.argsort(chosen, dim=-1), dim=-1)
    place = (torch.arange(n, device=h.device).unsqueeze(1) * k + rank).reshape(-1).index_select(0, order)
    byexp = torch.empty_like(out).index_copy_(0, place, out).view(n, k, block.hidden)
    final = byexp[:, 0].clone()
    for j in range(1, k):
        final += byexp[:, j]
    if block.shared:
        kids = module._modules
        final = final + torch.sigmoid(kids["shared_expert_gate"](h)) * kids["shared_expert"](h)
    final = final.reshape(shape)
    return (final, logits) if want_logits else final


def check(y: Any, ref: Any) -> str | None:
    """Why ``y`` does not match the block's own output ``ref`` (the evaluator's tolerance for the
    dtype, relative to the output's root mean square), or None."""
    import torch

    ys = y if isinstance(y, tuple) else (y,)
    rs = ref if isinstance(ref, tuple) else (ref,)
    if len(ys) != len(rs):
        return f"{len(ys)} outputs where the block returns {len(rs)}"
    for i, (a, b) in enumerate(zip(ys, rs)):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i} is not shaped as the block's"
        bad = check_fold(a, b, i)
        if bad is not None:
            return bad
    return None


def returns_of(ref: Any, block: Block, x: Any) -> str | None:
    """"tensor" or "tensor_logits" (the block returns its router logits too), or None."""
    import torch

    if isinstance(ref, torch.Tensor) and ref.shape == x.shape:
        return "tensor"
    if isinstance(ref, tuple) and len(ref) == 2 and all(isinstance(t, torch.Tensor) for t in ref) \
            and ref[0].shape == x.shape and ref[1].shape[-1] == block.experts:
        return "tensor_logits"
    return None


class ExpertsGuard(RewriteGuard):
    """One promoted experts card in one model: its status and what its calls must be."""

    kind = CardKind.EXPERTS

    def __init__(self, card: str, target: str, program: dict[str, Any], dtype: Any, device: str,
                 board: "StatusBoard", shadow_every: int, rank: int = 3) -> None:
        super().__init__(card, target, dtype, device, board, shadow_every, program)
        self.rank = rank
        """The hidden states' number of dims in the card's calls (the block may read them as [b, s, h])."""


@dataclass
class Served:
    """One block in one model, served by its card."""

    guard: ExpertsGuard
    block: Block
    module: Any
    original: Callable[..., Any]
    stacked: Stacked
    mods: list[Any] = field(default_factory=list)
    checked: bool = False
    calls: int = 0

    def why_not(self, args: tuple, kwargs: dict) -> str | None:
        import torch

        g = self.guard
        if kwargs or len(args) != 1:
            return "called with other arguments than the hidden states"
        x = args[0]
        why = g.input_mismatch(x)
        if why is not None:
            return why
        if x.dim() != g.rank:
            return f"{x.dim()} dims where the card's calls had {g.rank}"
        if x.shape[-1] != self.block.hidden:
            return f"hidden size {x.shape[-1]}"
        if self.module.training:
            return "the block is in training mode"
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.stacked.params)):
            return "gradients are needed"
        if hooked(*self.mods):
            return "forward hooks on the block or its children"
        if not self.stacked.intact():
            return "an expert's weight was replaced since the install"
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        g = self.guard
        st = g.status
        if not st.active:
            g.board.fell_back(st, "disabled")
            return self.original(*args, **kwargs)
        why = self.why_not(args, kwargs)
        if why is not None:
            g.board.fell_back(st, why)
            return self.original(*args, **kwargs)
        self.calls += 1
        check_now = not self.checked or (g.shadow_every > 0 and self.calls % g.shadow_every == 0)
        if check_now and g.device == "cuda" and torch.cuda.is_current_stream_capturing():
            g.board.fell_back(st, "not checked yet (in a CUDA graph capture)")
            return self.original(*args, **kwargs)
        p = g.program
        try:
            y = routed(args[0], self.module._modules[self.block.router].weight, self.stacked, self.block, p["norm"],
                       p["returns"] == "tensor_logits", self.module)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            g.board.disable(st, f"grouped pass error: {exc}")
            g.board.fell_back(st, "grouped pass error")
            return self.original(*args, **kwargs)
        if check_now:
            ref = self.original(*args, **kwargs)
            first, self.checked = not self.checked, True
            if not g.board.checked(st, check(y, ref), first):
                return ref
        g.board.served(st)
        return y


def program_block(module: Any, path: str, program: dict[str, Any]) -> Block | None:
    """The block at ``path`` if it is the card's (the same structure and activation), else None."""
    import torch

    wrapper = torch.nn.Module()
    wrapper.add_module("m", module)
    blocks, _ = find_blocks(wrapper)
    for b in blocks:
        if b.path == "m":
            b = dataclasses.replace(b, path=path)
            return b if b.program(program["norm"], program["returns"]) == program else None
    return None


def install(applied: Any, model: "torch.nn.Module", entries: list[Any], device: str, shadow_every: int,
            compiled: bool = False) -> None:
    """Serve the experts cards ``entries`` in ``model``: each block a card names gets the guarded
    grouped forward (``applied``'s replaced forwards, undone with it, its weights given their own
    storage again); a card none of whose blocks is found here is skipped with why. ``compiled``:
    for a model torch.compile'd after this, the block's forward is left out of Dynamo's graphs (a
    graph break, as the block's own ``.tolist()`` makes) and runs as here."""
    import torch

    for e in entries:
        spec = e.signature.inputs[0]
        guard = ExpertsGuard(e.card, e.signature.target, e.signature.program, getattr(torch, spec.dtype), device,
                             applied.board, shadow_every, len(spec.shape))
        why: list[str] = []
        for path in e.signature.module_paths:
            try:
                module = model.get_submodule(path)
            except AttributeError:
                why.append(f"{path}: not in this model")
                continue
            if "forward" in module.__dict__:
                why.append(f"{path}: its forward is replaced already")
                continue
            block = program_block(module, path, e.signature.program)
            if block is None:
                why.append(f"{path}: not the card's routed experts")
                continue
            stacked = Stacked(block, module, repoint=True)
            served = Served(guard, block, module, module.forward, stacked, list(module.modules()))
            applied._replace_forward(module, torch._dynamo.disable(served) if compiled else served)
            applied.on_undo(stacked.release)
            guard.status.sites.append(path)
        if guard.status.sites:
            applied.experts[e.card] = guard
        else:
            applied.skipped[e.card] = "none of its blocks is served in this model: " + "; ".join(why[:3])
