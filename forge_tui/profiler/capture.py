"""Capture every operator call of an unmodified model, at two granularities.

Ops: a ``TorchDispatchMode`` sees each aten call after autograd and composite decomposition
(what actually runs). Modules: forward hooks on leaf ``nn.Module``s bracket the aten calls
made inside them; those calls, with their data flow, become the module card's program. Calls
are grouped by signature (target, input shapes, dtypes, strides, non-tensor arguments); the
first few calls of each group keep their real inputs and outputs, packed on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cards import CardKind, TensorSpec
from ..program import Unencodable, encode, flatten_outputs, refs, resolve_op, tensor_leaves
from ..runtime.attrs import recorded_attrs
from ..runtime.graph import call_key, key_text
from ..tensorstore import pack
from .cost import op_flops, tensor_read_bytes, tensor_write_bytes
from .ops import (
    ALLOCATIONS,
    ATTENTION_PREFIXES,
    DYNAMIC_SHAPE,
    call_arguments,
    dtype_name,
    is_rng,
    is_view,
    op_name,
    returns_of,
    signature_key,
    spec_of,
)

CARD_ATTR = "forge_card"
"""A leaf module whose class sets this attribute true is a module card even when it is a single op
(the wrapper ``forge new`` and ``forge_tui.generate`` put around a reference function)."""


@dataclass
class Bucket:
    """All calls sharing one signature: the future card."""

    key: str
    kind: CardKind
    target: str
    program: dict
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    flops: int
    bytes: int
    calls: int = 0
    samples: list[tuple[list, list]] = field(default_factory=list)
    module_paths: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    first_seen: int = 0
    skipped_samples: int = 0
    call_args: Any = None
    """Module cards: the forward's arguments with each tensor replaced by {"$t": k} (None when
    they have no JSON form): the runtime serves only calls with the same non-tensor arguments."""
    returns: str = "tensor"
    """Module cards: how the forward returns its tensor outputs ("tensor" or "tuple")."""
    module_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Module cards: each module's plain attributes at its first call, by path (``_Frame.attrs``)."""
    parents: dict[str, int] = field(default_factory=dict)
    """Op cards: calls made inside each module card's forward (by the module bucket's key)."""
    outside: int = 0
    """Op cards: calls made outside every module card (no leaf module, or one that makes no card)."""
    scope_keys: list[str] = field(default_factory=list)
    """Op and chain cards: the calls of the module whose forward made this card's calls, by their
    key (``runtime.graph.key_text``), at most ``SCOPE_KEYS``: the calls a compiled scope there
    must compile a variant for, whatever it met before."""
    phases: dict[str, int] = field(default_factory=dict)
    """Calls per generation phase (``Recorder.phase``: "prefill", "decode"), in a profile of a
    generation."""

    def count(self, phase: str | None) -> None:
        """One more call, made in ``phase`` (None outside a generation)."""
        self.calls += 1
        if phase is not None:
            self.phases[phase] = self.phases.get(phase, 0) + 1


SCOPE_KEYS = 8


@dataclass
class _Frame:
    module: Any
    path: str
    refs: Any  # WeakIdKeyDictionary: tensor -> ref
    tensors: list  # the card's input tensors, in order (inputs, params, consts)
    specs: list[TensorSpec]
    nodes: list = field(default_factory=list)
    flops: int = 0
    rng: bool = False
    flags: set[str] = field(default_factory=set)
    invalid: str = ""
    sample_inputs: list | None = None
    pre_key: tuple[Any, ...] = ()
    call_args: Any = None
    """The bucket key of the module call as first seen (its sample count is kept under it)."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """The module's plain attributes as the call found them (``runtime.attrs.recorded_attrs``)."""
    op_keys: list[str] = field(default_factory=list)
    """The op buckets of the calls made inside this frame, one entry a call."""


@dataclass
class _Chain:
    """Ops a module's own forward calls one after another, each taking an output of one before
    it (``scores * scale + mask``, then a softmax in fp32, then a cast): a chain card once two or
    more are linked. Its inputs are the tensors from outside the chain, in order."""

    path: str
    refs: Any  # WeakIdKeyDictionary: tensor -> ref
    tensors: list
    specs: list[TensorSpec]
    sample_inputs: list | None
    nodes: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    """Each node's tensor outputs (held until the chain closes: the last one is its output)."""
    op_keys: list[str] = field(default_factory=list)
    flops: int = 0
    scope_key: str = ""
    """The key of the call of ``path`` that made the chain (``Bucket.scope_keys``)."""

    def computed(self, tensors) -> bool:
        """Whether any of ``tensors`` is a value the chain computed (not one of its inputs)."""
        return any(self.refs.get(t, {}).get("$node") is not None for t in tensors)


def _note_key(bucket: Bucket, key: str) -> None:
    if key not in bucket.scope_keys and len(bucket.scope_keys) < SCOPE_KEYS:
        bucket.scope_keys.append(key)


def _prune(chain: _Chain) -> None:
    """``chain`` without the links its last one does not read, directly or through others, nor
    the inputs only those read: nodes and inputs renumbered, in order."""
    live = {len(chain.nodes) - 1}
    for i in range(len(chain.nodes) - 1, -1, -1):
        if i in live:
            live.update(refs([chain.nodes[i]["args"], chain.nodes[i]["kwargs"]], "$node"))
    if len(live) == len(chain.nodes):
        return
    keep = sorted(live)
    used = sorted({k for i in keep for k in refs([chain.nodes[i]["args"], chain.nodes[i]["kwargs"]], "$in")})
    node_at = {old: new for new, old in enumerate(keep)}
    in_at = {old: new for new, old in enumerate(used)}

    def renumber(x):
        if isinstance(x, dict):
            if "$node" in x:
                return {**x, "$node": node_at[x["$node"]]}
            if "$in" in x:
                return {**x, "$in": in_at[x["$in"]]}
            return {k: renumber(v) for k, v in x.items()}
        if isinstance(x, list):
            return [renumber(v) for v in x]
        return x

    chain.nodes = [{**chain.nodes[i], "args": renumber(chain.nodes[i]["args"]),
                    "kwargs": renumber(chain.nodes[i]["kwargs"])} for i in keep]
    chain.outs = [chain.outs[i] for i in keep]
    chain.op_keys = [chain.op_keys[i] for i in keep]
    tensors = [chain.tensors[k] for k in used]
    chain.specs = [chain.specs[k] for k in used]
    if chain.sample_inputs is not None:
        chain.sample_inputs = [chain.sample_inputs[k] for k in used]
    chain.tensors = tensors
    held = chain.refs
    for t in list(held.keys()):
        r = held[t]
        if "$in" in r and r["$in"] in in_at:
            held[t] = {"$in": in_at[r["$in"]]}
        elif "$node" in r and r["$node"] in node_at:
            held[t] = {**r, "$node": node_at[r["$node"]]}
        else:
            del held[t]


class CaptureOptions:
    def __init__(self, cfg) -> None:
        self.ops = cfg.ops
        self.modules = cfg.modules
        self.skip_views = cfg.skip_views
        self.skip_rng = cfg.skip_rng
        self.skip_param_copies = cfg.skip_param_copies
        self.chains = cfg.chains
        self.samples_per_card = cfg.samples_per_card
        self.max_sample_bytes = int(cfg.max_sample_mib * (1 << 20))


def _make_mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Mode(TorchDispatchMode):
        def __init__(self, recorder: "Recorder") -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self.recorder.on_call(func, args, kwargs or {})

    return _Mode


class Recorder:
    """Runs a model under capture; ``buckets`` holds the result."""

    def __init__(self, model, options: CaptureOptions) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.model = model
        self.opt = options
        self.params = WeakIdKeyDictionary()
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            self.params[p] = name
        self.buckets: dict[str, Bucket] = {}
        self.frame: _Frame | None = None
        self.busy = False  # our own tensor work inside hooks is not captured
        self.seq = 0
        self.skipped: dict[str, int] = {"views": 0, "rng": 0, "param_copies": 0, "allocations": 0, "no_tensor_output": 0}
        self._module_samples: dict[tuple, int] = {}
        self._handles: list = []
        self._scopes: list[str] = []
        """The paths of the modules whose forward is running, innermost last: an op card records the
        innermost as its scope, the module whose own forward made the call (not a child's)."""
        self._scope_keys: list[list[Any]] = []
        """The key of each of ``_scopes``' calls, [``call_key``, its text or None]: the text is
        written at the first card made in the call (``_scope_key``), not at every module call."""
        self._WeakIdKeyDictionary = WeakIdKeyDictionary
        self._chains: dict[str, _Chain] = {}
        """The open chain of each module whose own forward is running (``_chain_step``)."""
        self.phase: str | None = None
        """The generation phase the calls now belong to ("prefill", "decode"; set by the caller
        that profiles a generation, ``profiler.generation.PhaseMarker``), None for a forward."""

    # ---- public -------------------------------------------------------------------------------
    def run(self, fn):
        mode = _make_mode_class()(self)
        self._install_scope_hooks()
        if self.opt.modules:
            self._install_hooks()
        try:
            with mode:
                return fn()
        finally:
            for h in self._handles:
                h.remove()
            self._handles.clear()
            self.frame = None
            for path in list(self._chains):
                self._close_chain(path)
            self._scopes.clear()
            self._scope_keys.clear()

    # ---- ops ----------------------------------------------------------------------------------
    def _within_budget(self, tensors) -> bool:
        return sum(t.numel() * t.element_size() for t in tensors) <= self.opt.max_sample_bytes

    def on_call(self, func, args, kwargs):
        if self.busy:
            return func(*args, **kwargs)
        self.busy = True
        try:
            return self._record(func, args, kwargs)
        finally:
            self.busy = False

    def _record(self, func, args, kwargs):
        import torch

        name = op_name(func)
        in_tensors = tensor_leaves((args, kwargs))
        # Decide before running: in-place ops change their inputs.
        op_card = self.opt.ops
        reason = None
        if name in ALLOCATIONS:
            reason = "allocations"
        elif self.opt.skip_views and is_view(func):
            reason = "views"
        elif self.opt.skip_rng and is_rng(func, args, kwargs):
            reason = "rng"
        elif self.opt.skip_param_copies and in_tensors and all(t in self.params for t in in_tensors):
            reason = "param_copies"
        if reason is not None:
            op_card = False

        program = key = None
        specs: list[TensorSpec] = []
        if op_card:
            index: dict[int, int] = {}
            uniq: list = []

            def ref(t):
                k = index.get(id(t))
                if k is None:
                    k = index[id(t)] = len(uniq)
                    uniq.append(t)
                return {"$in": k}

            try:
                node = {"op": str(func), "args": encode(list(args), ref), "kwargs": encode(dict(kwargs), ref)}
            except Unencodable:
                op_card = False
            else:
                specs = [spec_of(t, "param" if t in self.params else "input", with_range=False) for t in uniq]
                program = {"nodes": [node], "outputs": []}
                key = signature_key(CardKind.OP, str(func), program, specs)
        bucket = self.buckets.get(key) if key else None
        sample_in = None
        if op_card and (bucket is None or len(bucket.samples) < self.opt.samples_per_card):
            if self._within_budget(uniq):
                sample_in = [pack(t) for t in uniq]

        out = func(*args, **kwargs)
        self.seq += 1
        flat_out = flatten_outputs(out)
        out_tensors = [t for t in flat_out if isinstance(t, torch.Tensor)]

        if self.frame is not None:
            self._frame_node(func, args, kwargs, out, flat_out, in_tensors, out_tensors)
        elif self.opt.chains:
            self._chain_step(func, args, kwargs, out, flat_out, in_tensors, out_tensors,
                             key if op_card and reason is None and out_tensors else None)
        if in_tensors and all(t in self.params for t in in_tensors):
            for t in out_tensors:  # a copy or view of parameters is parameter-derived too
                self.params[t] = "derived"

        if reason is not None:
            self.skipped[reason] += 1
            return out
        if not op_card:
            return out
        if not out_tensors:
            self.skipped["no_tensor_output"] += 1
            return out
        if op_card and program is not None:
            program["nodes"][0]["out"] = _out_meta(flat_out)
        if name.startswith(ATTENTION_PREFIXES):
            # Attention ops also return softmax statistics and RNG state (seed, offset) that
            # inference never reads; the card is the attention output alone.
            out_tensors = out_tensors[:1]
        if bucket is None:
            program["outputs"] = [{"$node": 0, "out": j} for j, t in enumerate(flat_out)
                                  if isinstance(t, torch.Tensor)][:len(out_tensors)]
            specs = [spec_of(t, s.role) for t, s in zip(uniq, specs)]
            # "direct": module_paths name the module whose own forward makes the call, so the
            # runtime intercepts that module's own ops and not its children's
            flags = {"direct"}
            if func._schema.is_mutable:
                flags.add("mutates")
            if name in DYNAMIC_SHAPE or (name == "where" and len(args) == 1):
                flags.add("dynamic_shape")
            bucket = Bucket(
                key=key, kind=CardKind.OP, target=str(func), program=program, inputs=specs,
                outputs=[spec_of(t, "output", with_range=False) for t in out_tensors],
                flops=op_flops(func, args, kwargs, out, uniq, out_tensors),
                bytes=sum(tensor_read_bytes(t) for t in uniq) + sum(tensor_write_bytes(t) for t in out_tensors),
                flags=flags, first_seen=self.seq,
            )
            self.buckets[key] = bucket
        bucket.count(self.phase)
        if self.frame is not None:
            self.frame.op_keys.append(bucket.key)
        else:
            bucket.outside += 1
        if self.frame is not None:
            if self.frame.path not in bucket.module_paths:
                bucket.module_paths.append(self.frame.path)
        elif self._scopes and self._scopes[-1] not in bucket.module_paths:
            bucket.module_paths.append(self._scopes[-1])
        if self._scope_keys:  # the innermost module's call: a leaf's where a leaf frame is open
            _note_key(bucket, self._scope_key())
        if len(bucket.samples) < self.opt.samples_per_card:
            if sample_in is not None and self._within_budget(out_tensors):
                bucket.samples.append((sample_in, [pack(t) for t in out_tensors]))
            else:
                bucket.skipped_samples += 1
        return out

    # ---- chains -------------------------------------------------------------------------------
    def _chain_step(self, func, args, kwargs, out, flat_out, in_tensors, out_tensors, op_key: str | None) -> None:
        """An op a module's own forward made (no leaf module's frame open): it extends that
        module's open chain when it is a link (``chains_op``) taking one of the chain's tensors;
        one that takes a chain tensor and is no link closes the chain; a link taking none closes
        it and starts the next. Ops touching no chain tensor and no link leave it open. A view or
        join the chain can express in its indexing (``index_link``: rotate-half's slices and
        ``cat``) extends it where it reads any of its tensors, its inputs included (``q * cos +
        rotate_half(q) * sin`` is one chain), and never starts one."""
        from ..codegen.lower import chains_op, index_link

        path = self._scopes[-1] if self._scopes else ""
        chain = self._chains.get(path)
        touches = chain is not None and chain.computed(in_tensors)
        name = str(func)
        if chain is not None and in_tensors and index_link(name) and out_tensors and \
                all(t in chain.refs for t in in_tensors):
            link, touches = True, True
        else:
            link = op_key is not None and chains_op(name) and bool(in_tensors)
        if not link:
            if touches:
                self._close_chain(path)
            return
        if chain is not None and not touches:
            self._close_chain(path)
            chain = None
        if chain is None:
            chain = self._chains[path] = _Chain(path=path, refs=self._WeakIdKeyDictionary(), tensors=[], specs=[],
                                                sample_inputs=[],
                                                scope_key=self._scope_key() if self._scope_keys else "")

        def ref(t):
            r = chain.refs.get(t)
            if r is None:
                r = chain.refs[t] = {"$in": len(chain.tensors)}
                chain.tensors.append(t)
                chain.specs.append(spec_of(t, "param" if t in self.params else "input", with_range=False))
                if chain.sample_inputs is not None:
                    chain.sample_inputs = chain.sample_inputs + [pack(t)] if self._within_budget(chain.tensors) else None
            return r

        try:
            node = {"op": str(func), "args": encode(list(args), ref), "kwargs": encode(dict(kwargs), ref)}
        except Unencodable:
            self._close_chain(path)
            return
        node["out"] = _out_meta(flat_out)
        i = len(chain.nodes)
        chain.nodes.append(node)
        for j, t in enumerate(flat_out):
            if any(t is o for o in out_tensors):
                chain.refs[t] = {"$node": i, "out": j}
        chain.outs.append(out_tensors)
        chain.op_keys.append(op_key or "")
        chain.flops += op_flops(func, args, kwargs, out, in_tensors, out_tensors)

    def _close_chain(self, path: str) -> None:
        """The chain card of ``path``'s open chain, when it links two ops or more that compute
        (views and joins do not count): its program, its inputs, its output (the last op's
        first), and its ops' calls counted inside it. Links its output does not read (a slice
        the chain took that something else read) are left out first, and the inputs they alone
        read."""
        from ..codegen.lower import index_link

        chain = self._chains.pop(path, None)
        if chain is None or not chain.outs or not chain.outs[-1]:
            return
        if any(index_link(n["op"]) for n in chain.nodes):
            _prune(chain)
            if index_link(chain.nodes[-1]["op"]):
                return  # a view or a join last: the chain computed its values before it
        if sum(not index_link(n["op"]) for n in chain.nodes) < 2:
            return
        busy, self.busy = self.busy, True  # the value ranges it reads are our work, not the model's
        try:
            self._chain_card(chain, path)
        finally:
            self.busy = busy

    def _chain_card(self, chain: _Chain, path: str) -> None:
        out = chain.outs[-1][0]
        program = {"nodes": chain.nodes, "outputs": [chain.refs[out]]}
        target = "chain:" + "+".join(op_name(resolve_op(n["op"])) for n in chain.nodes)
        key = signature_key(CardKind.CHAIN, target, program, chain.specs)
        bucket = self.buckets.get(key)
        if bucket is None:
            specs = [spec_of(t, s.role) for t, s in zip(chain.tensors, chain.specs)]
            bucket = Bucket(
                key=key, kind=CardKind.CHAIN, target=target, program=program, inputs=specs,
                outputs=[spec_of(out, "output", with_range=False)], flops=chain.flops,
                bytes=sum(tensor_read_bytes(t) for t in chain.tensors) + tensor_write_bytes(out),
                flags={"direct"}, first_seen=self.seq,
            )
            self.buckets[key] = bucket
        bucket.count(self.phase)
        if path not in bucket.module_paths:
            bucket.module_paths.append(path)
        if chain.scope_key:
            _note_key(bucket, chain.scope_key)
        if len(bucket.samples) < self.opt.samples_per_card:
            if chain.sample_inputs is not None and self._within_budget([out]):
                bucket.samples.append((chain.sample_inputs, [pack(out)]))
            else:
                bucket.skipped_samples += 1
        for op_key in chain.op_keys:  # each op call is inside the chain, not outside every card
            b = self.buckets.get(op_key)
            if b is None:
                continue
            b.outside -= 1
            b.parents[key] = b.parents.get(key, 0) + 1

    # ---- modules ------------------------------------------------------------------------------
    def _install_scope_hooks(self) -> None:
        """Every module's path on ``_scopes`` while its forward runs (popped on an exception too)."""
        for path, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._push_scope(path), with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._pop_scope(path), always_call=True))

    def _scope_key(self) -> str:
        """The innermost module call's key text (``Bucket.scope_keys``)."""
        top = self._scope_keys[-1]
        if top[1] is None:
            top[1] = key_text(top[0])
        return top[1]

    def _push_scope(self, path: str):
        def hook(module, args, kwargs):
            parent = self._scopes[-1] if self._scopes else None
            chain = self._chains.get(parent) if parent is not None else None
            if chain is not None and chain.computed(tensor_leaves((args, kwargs))):
                # a child reads an intermediate of the chain: it must be computed, the chain ends
                self._close_chain(parent)
            self._scopes.append(path)
            self._scope_keys.append([call_key(args, kwargs), None])

        return hook

    def _pop_scope(self, path: str):
        def hook(module, args, output):
            if self._scopes and self._scopes[-1] == path:
                self._scopes.pop()
                self._scope_keys.pop()
            if path in self._chains:
                self._close_chain(path)

        return hook

    def _install_hooks(self) -> None:
        for path, mod in self.model.named_modules():
            if any(True for _ in mod.children()):
                continue
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._post_hook(), with_kwargs=True))

    def _pre_hook(self, path: str):
        def hook(module, args, kwargs):
            if self.busy or self.frame is not None:
                return None
            self.busy = True
            try:
                frame = _Frame(module=module, path=path, refs=self._WeakIdKeyDictionary(), tensors=[], specs=[])
                for t in tensor_leaves((args, kwargs)):
                    if t not in frame.refs:
                        frame.refs[t] = {"$in": len(frame.tensors)}
                        frame.tensors.append(t)
                        frame.specs.append(spec_of(t, "input", with_range=False))
                for pname, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                    if p is not None and p not in frame.refs:
                        frame.refs[p] = {"$in": len(frame.tensors)}
                        frame.tensors.append(p)
                        frame.specs.append(spec_of(p, "param", pname, with_range=False))
                frame.call_args = call_arguments(args, kwargs)
                frame.attrs = recorded_attrs(module)
                pre_key = (type(module).__qualname__, tuple((tuple(s.shape), s.dtype) for s in frame.specs))
                if self._module_samples.get(pre_key, 0) < self.opt.samples_per_card and self._within_budget(frame.tensors):
                    frame.sample_inputs = [pack(t) for t in frame.tensors]
                frame.pre_key = pre_key
                self.frame = frame
            finally:
                self.busy = False
            return None

        return hook

    def _frame_node(self, func, args, kwargs, out, flat_out, in_tensors, out_tensors) -> None:
        import torch

        frame = self.frame
        if frame is None or frame.invalid:
            return

        def ref(t):
            r = frame.refs.get(t)
            if r is None:  # a tensor from outside the module's inputs: a constant input
                r = frame.refs[t] = {"$in": len(frame.tensors)}
                frame.tensors.append(t)
                frame.specs.append(spec_of(t, "const", with_range=False))
                if frame.sample_inputs is not None:
                    frame.sample_inputs.append(pack(t))
            return r

        try:
            node = {"op": str(func), "args": encode(list(args), ref), "kwargs": encode(dict(kwargs), ref)}
        except Unencodable as exc:
            frame.invalid = f"unencodable argument {exc}"
            return
        node["out"] = _out_meta(flat_out)
        i = len(frame.nodes)
        frame.nodes.append(node)
        for j, t in enumerate(flat_out):
            if isinstance(t, torch.Tensor):
                frame.refs[t] = {"$node": i, "out": j}
        if not is_view(func):
            frame.flops += op_flops(func, args, kwargs, out, in_tensors, out_tensors)
        if is_rng(func, args, kwargs):
            frame.rng = True
        if func._schema.is_mutable:
            frame.flags.add("mutates")
        if op_name(func) in DYNAMIC_SHAPE:
            frame.flags.add("dynamic_shape")

    def _post_hook(self):
        def hook(module, args, kwargs, output):
            frame = self.frame
            if self.busy or frame is None or frame.module is not module:
                return None
            self.frame = None
            self.busy = True
            try:
                self._close_frame(frame, output)
            finally:
                self.busy = False
            return None

        return hook

    def _close_frame(self, frame: _Frame, output) -> None:
        key = self._module_bucket(frame, output)
        for op_key in frame.op_keys:  # where each op call made inside the frame belongs
            b = self.buckets[op_key]
            if key is None:
                b.outside += 1
            else:
                b.parents[key] = b.parents.get(key, 0) + 1

    def _module_bucket(self, frame: _Frame, output) -> str | None:
        """Record the frame's module call; the key of its bucket, or None when it makes no card."""
        funcs = [resolve_op(n["op"]) for n in frame.nodes]
        compute = [f for f in funcs if _is_compute(f)]
        if frame.invalid or not compute or (frame.rng and self.opt.skip_rng):
            return None
        outs = tensor_leaves(output)
        refs = []
        for t in outs:
            r = frame.refs.get(t)
            if r is None:
                return None
            refs.append(r)
        program = _drops_scratch(frame.nodes, refs)
        if program is None:
            if len(compute) < 2 and not _drops_outputs(frame.nodes, refs) and not getattr(frame.module, CARD_ATTR, False):
                return None  # a single-op module that returns all its op's outputs is already an op card
            program = {"nodes": frame.nodes, "outputs": refs}
        target = f"module:{type(frame.module).__name__}"
        key = signature_key(CardKind.MODULE, target, program, frame.specs)
        bucket = self.buckets.get(key)
        if bucket is None:
            specs = [spec_of(t, s.role, s.name) for t, s in zip(frame.tensors, frame.specs)]
            bucket = Bucket(
                key=key, kind=CardKind.MODULE, target=target, program=program, inputs=specs,
                outputs=[spec_of(t, "output", with_range=False) for t in outs], flops=frame.flops,
                bytes=sum(tensor_read_bytes(t) for t in frame.tensors) + sum(tensor_write_bytes(t) for t in outs),
                flags=set(frame.flags), first_seen=self.seq, call_args=frame.call_args,
                returns=returns_of(output),
            )
            self.buckets[key] = bucket
        bucket.count(self.phase)
        if frame.path not in bucket.module_paths:
            bucket.module_paths.append(frame.path)
        bucket.module_attrs.setdefault(frame.path, frame.attrs)
        if len(bucket.samples) < self.opt.samples_per_card:
            if frame.sample_inputs is not None and self._within_budget(outs):
                bucket.samples.append((frame.sample_inputs, [pack(t) for t in outs]))
                self._module_samples[frame.pre_key] = self._module_samples.get(frame.pre_key, 0) + 1
            else:
                bucket.skipped_samples += 1
        return key


def _is_compute(func) -> bool:
    """An op that computes (not a view, not an allocation)."""
    return not is_view(func) and op_name(func) not in ALLOCATIONS


SCRATCH_OUTPUTS = {"aten.native_batch_norm.default", "aten.cudnn_batch_norm.default", "aten.miopen_batch_norm.default"}
"""Ops whose outputs after the first are scratch in inference: a batch norm's saved statistics
(and cuDNN's reserve), which CUDA allocates and leaves unwritten in eval mode, so no kernel can be
checked against them. A module that returns the first output alone (nn.BatchNorm2d) is a card,
whose kernel writes that output only."""


def _refs_nodes(value) -> bool:
    if isinstance(value, dict):
        return "$node" in value or any(_refs_nodes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_refs_nodes(v) for v in value)
    return False


def _drops_scratch(nodes: list, refs: list) -> dict | None:
    """The program of a module that calls one SCRATCH_OUTPUTS op on its inputs and returns its
    first output alone (the allocations PyTorch makes around it, which nothing reads, left out),
    or None."""
    idx = [i for i, n in enumerate(nodes) if n["op"] in SCRATCH_OUTPUTS]
    if len(idx) != 1 or refs != [{"$node": idx[0], "out": 0}]:
        return None
    node = nodes[idx[0]]
    others = [n for i, n in enumerate(nodes) if i != idx[0]]
    if _refs_nodes([node["args"], node.get("kwargs", {})]) or any(_is_compute(resolve_op(n["op"])) for n in others):
        return None
    return {"nodes": [node], "outputs": [{"$node": 0, "out": 0}]}


def _drops_outputs(nodes: list, refs: list) -> bool:
    """The module returns a part of its op's outputs and drops at least a quarter of the bytes
    they hold: nn.MaxPool2d returns the values of max_pool2d_with_indices and drops the indices
    (4x the bytes for fp16). Its card is the module, whose kernel need not compute or write what
    nobody reads (the op card still asks for both). Small dropped statistics (a norm's saved mean
    and rstd) make no card of their own."""
    import torch

    size = {}
    for i, n in enumerate(nodes):
        if _is_compute(resolve_op(n["op"])):
            for j, meta in enumerate(n.get("out") or []):
                if meta is not None:
                    numel = 1
                    for d in meta[0]:
                        numel *= d
                    dtype = getattr(torch, meta[1], None)
                    size[(i, j)] = numel * (dtype.itemsize if isinstance(dtype, torch.dtype) else 4)
    used = {(r["$node"], r["out"]) for r in refs if "$node" in r}
    if not size or not used < set(size):
        return False
    dropped = sum(b for k, b in size.items() if k not in used)
    return dropped * 4 >= sum(size.values())


def _out_meta(flat_out) -> list:
    """[shape, dtype] of each output leaf (None for non-tensors): the program's types."""
    import torch

    return [[list(t.shape), dtype_name(t)] if isinstance(t, torch.Tensor) else None for t in flat_out]
