"""A model's forward replayed from CUDA graphs piece by piece, where it cannot be captured whole.

On a fast GPU a bundled forward is bound by the host (Python and dispatch for every eager op), so
device time that forge's kernels save is hidden op by op; in a CUDA graph the host's
work is paid once, at capture. Most real models cannot be captured whole: the bundled decoder
copies a CPU scalar to the GPU at the top of its forward, Hugging Face's mask code synchronises,
the MoE's routing reads counts back. ``capture_pieces(model)`` tries the model first; a module
whose forward cannot be captured (or may not be: below) runs as written and its children are
tried in its place, down to the pieces that can. A piece keeps one graph per call signature (each
tensor argument's shape, strides, dtype and device, every other argument's value), at most
``max_graphs``; a call copies its tensors into the graph's static inputs, replays, and returns
copies of the static outputs.

A replay repeats the device work of the captured call and nothing else, so a piece is captured
only where that is the whole of its forward, as far as can be seen:
- its first call (run as written: its result is the call's) changes none of its parameters,
  buffers or plain attributes, and the capture changes none of its inputs;
- its arguments are tensors (none with overlapping memory) and plain values, and its outputs
  tensors in lists, tuples and dicts, none sharing memory with its inputs or parameters;
- every call then checks that the module tree still holds the same parameter and buffer tensors
  and the same training flags, that no gradient, autocast or ``__torch_function__`` mode is on,
  and that no capture is already running; otherwise the piece runs as written.
What it cannot see is Python state outside the module tree that the forward reads (a global, a
config object changed in place): the same contract as capturing a model by hand.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .direct import plain_context as _plain_context
from .forwards import ReplacedForwards, called_children

if TYPE_CHECKING:
    import torch

PLAIN = (type(None), bool, int, float, str)


class Capturer(Protocol):
    """Captures a call: returns (replay, its outputs as captured). Raises where it cannot."""

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]: ...


def end_failed_capture() -> None:
    """Put the CUDA generator back out of capture after a capture that failed: PyTorch ends its
    capture state only when a capture ends well (CUDAGraph::capture_end throws before the
    generator's epilogue), so every later random op in the process raised "Offset increment
    outside graph capture encountered unexpectedly" (the MoE example's model could not even be
    built again after its forward failed to capture). A capture that succeeds runs the prologue
    and the epilogue on the default generator, which ends that state."""
    import torch

    try:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            buf = torch.zeros(1, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                buf.add_(1)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - nothing more to do: the caller reports the first failure
        pass


class CudaCapturer:
    """torch.cuda.graph capture into one memory pool for all of a model's pieces (they replay one
    after another on one stream, and every piece's outputs are copied out after its replay)."""

    def __init__(self) -> None:
        import torch

        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        import torch

        caller = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(caller)
        try:
            with torch.cuda.stream(side):
                fn()  # the warm-up a capture needs (lazy initialisation stays out of the graph)
            caller.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = fn()
        except Exception:
            torch.cuda.set_stream(caller)
            end_failed_capture()
            raise
        finally:
            torch.cuda.set_stream(caller)
        return graph.replay, out


class _ThreadStderr:
    """``sys.stderr`` while captures hold their threads' output (``held_stderr``): a write from a
    thread that holds goes to its buffer, any other thread's to the stream it replaced."""

    def __init__(self, real: Any, held: dict[int, io.StringIO]) -> None:
        self.real = real
        self.held = held

    def write(self, text: str) -> int:
        buf = self.held.get(threading.get_ident())
        return (buf if buf is not None else self.real).write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


_HELD: dict[int, io.StringIO] = {}
_HELD_LOCK = threading.Lock()
_PROXY: list[_ThreadStderr] = []


@contextlib.contextmanager
def held_stderr() -> Any:
    """What this thread writes to ``sys.stderr`` inside the block, held in the StringIO it yields;
    other threads' writes pass through as they would (``contextlib.redirect_stderr`` would hold
    theirs too: a UI worker's or a logger's output in that moment, shown only with the capture's)."""
    buf = io.StringIO()
    me = threading.get_ident()
    with _HELD_LOCK:
        if not _HELD:
            _PROXY[:] = [_ThreadStderr(sys.stderr, _HELD)]
            sys.stderr = _PROXY[0]  # type: ignore[assignment]
        outer = _HELD.get(me)  # a hold inside another on this thread: the outer one is back after it
        _HELD[me] = buf
    try:
        yield buf
    finally:
        with _HELD_LOCK:
            if outer is not None:
                _HELD[me] = outer
            else:
                _HELD.pop(me, None)
            if not _HELD and _PROXY:
                if sys.stderr is _PROXY[0]:  # put back unless someone replaced it since
                    sys.stderr = _PROXY[0].real
                _PROXY.clear()


class Refused(Exception):
    """Why a piece is not captured for a call signature."""


def _key(flat: list[Any], spec: Any) -> tuple[Any, ...] | None:
    import torch

    parts: list[Any] = [spec]
    for x in flat:
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
                return None
            parts.append((tuple(x.shape), x.stride(), x.dtype, x.device))
        elif type(x) in PLAIN:
            parts.append((type(x), x))
        else:
            return None
    return tuple(parts)


class _TreeState:
    """What a capture assumes of the module tree: each parameter and buffer as (its dict, name,
    tensor); each module's training flag; each plain attribute as (the module's __dict__, name,
    value); the tensors' versions (an in-place change bumps them)."""

    __slots__ = ("tensors", "flags", "plain", "versions")

    def __init__(self, module: "torch.nn.Module") -> None:
        self.tensors: list[tuple[Any, str, Any]] = []
        self.flags: list[tuple[Any, bool]] = []
        self.plain: list[tuple[Any, str, Any]] = []
        for m in module.modules():
            self.flags.append((m, m.training))
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None:
                        self.tensors.append((store, name, t))
            d = m.__dict__
            for name, v in d.items():
                if type(v) in PLAIN and name != "training":
                    self.plain.append((d, name, v))
        self.versions = [t._version for _, _, t in self.tensors]

    def same_as(self, before: "_TreeState") -> bool:
        """Whether nothing changed since ``before``: no tensor replaced or changed in place, no
        plain attribute changed."""
        return self.versions == before.versions and \
            [id(t) for _, _, t in self.tensors] == [id(t) for _, _, t in before.tensors] and \
            [(n, v) for _, n, v in self.plain] == [(n, v) for _, n, v in before.plain]

    def holds(self) -> bool:
        """Whether the module tree is still as recorded: the same parameter and buffer tensors,
        training flags and plain attributes (a call's check, before it replays)."""
        return all(store.get(name) is t for store, name, t in self.tensors) and \
            all(m.training is f for m, f in self.flags) and \
            all(_same(d.get(name), v) for d, name, v in self.plain)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _storages(tensors: list[Any]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


class _Graph:
    __slots__ = ("replay", "inputs", "outputs", "state")

    def __init__(self, replay: Callable[[], None], inputs: list[Any], outputs: Any, state: _TreeState) -> None:
        self.replay = replay
        self.inputs = inputs
        self.outputs = outputs
        self.state = state


class Piece:
    """One module's forward, replayed from its graphs where it can be (see the module docstring)."""

    def __init__(self, owner: "Pieces", path: str, module: "torch.nn.Module", original: Callable[..., Any]) -> None:
        self.owner = owner
        self.path = path
        self.module = module
        self.original = original
        self.graphs: dict[Any, _Graph] = {}
        self.refused: dict[Any, str] = {}
        self.replays = 0
        self.fallbacks: dict[str, int] = {}

    def _fall(self, why: str) -> None:
        self.fallbacks[why] = self.fallbacks.get(why, 0) + 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        owner = self.owner
        if not owner.active or torch.is_grad_enabled() or not owner.quiet_context():
            return self.original(*args, **kwargs)
        flat, spec = tree_flatten((args, kwargs))
        key = _key(flat, spec)
        if key is None:
            return self._refuse_all("arguments other than plain tensors and plain values", args, kwargs)
        g = self.graphs.get(key)
        if g is None:
            if key in self.refused:
                return self.original(*args, **kwargs)
            if len(self.graphs) >= owner.max_graphs:
                self._fall(f"more than {owner.max_graphs} call signatures")
                return self.original(*args, **kwargs)
            return self._first(key, flat, spec, args, kwargs)
        if not g.state.holds():
            self._fall("its parameters, buffers or attributes changed since the capture")
            return self.original(*args, **kwargs)
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        for dst, src in zip(g.inputs, tensors):
            dst.copy_(src)
        g.replay()
        self.replays += 1
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, g.outputs)

    def _refuse_all(self, why: str, args: Any, kwargs: Any) -> Any:
        self.refused.setdefault("*", why)
        self.owner.split(self)
        return self.original(*args, **kwargs)

    def _first(self, key: Any, flat: list[Any], spec: Any, args: Any, kwargs: Any) -> Any:
        """The signature's first call: run as written (its result is the call's), then captured."""
        import torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        before = _TreeState(self.module)
        out = self.original(*args, **kwargs)
        try:
            state = _TreeState(self.module)
            if not state.same_as(before):
                raise Refused("its forward changes its parameters, buffers or attributes")
            outs, _ = tree_flatten(out)
            if any(not isinstance(o, torch.Tensor) and type(o) not in PLAIN for o in outs):
                raise Refused("it returns something other than tensors and plain values")
            ins = [x for x in flat if isinstance(x, torch.Tensor)]
            static = []
            for t in ins:
                if t.numel() > 1 and 0 in t.stride():
                    raise Refused("a tensor argument with overlapping memory (an expanded view)")
                s = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                s.copy_(t)
                static.append(s)
            it = iter(static)
            s_args, s_kwargs = tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in flat], spec)
            versions = [s._version for s in static]
            # What the capture's calls print to stderr is held back (this thread's alone): where
            # the capture fails, the reason below says it in one line, where torch.fx would print a
            # whole traceback (a traced forward prints one before it re-raises); where it
            # succeeds, it is shown.
            try:
                with held_stderr() as said:
                    replay, s_out = self.owner.capturer.capture(lambda: self.original(*s_args, **s_kwargs))
            except Refused:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure to capture: the piece runs as written
                cause = exc.__context__ if exc.__context__ is not None else exc
                text = (str(cause).splitlines() or [""])[0][:200]
                raise Refused(f"not capturable: {type(cause).__name__}: {text}") from None
            if said.getvalue():
                sys.stderr.write(said.getvalue())
            if [s._version for s in static] != versions:
                raise Refused("its forward changes its inputs in place")
            s_outs, _ = tree_flatten(s_out)
            held = _storages(static) | _storages([t for _, _, t in state.tensors])
            if _storages([o for o in s_outs if isinstance(o, torch.Tensor)]) & held:
                raise Refused("it returns a view of its inputs or parameters")
            self.graphs[key] = _Graph(replay, static, s_out, state)
        except Refused as why:
            self.refused[key] = str(why)
            self.owner.split(self)
        return out

    def status(self) -> dict[str, Any]:
        return {"graphs": len(self.graphs), "replays": self.replays,
                "refused": sorted(set(self.refused.values())), "fallbacks": dict(self.fallbacks)}


class Pieces:
    """What ``capture_pieces`` installed; ``undo()`` (or leaving the ``with`` block) removes it."""

    def __init__(self, model: "torch.nn.Module", capturer: Capturer, max_graphs: int, device: str) -> None:
        self.model = model
        self.capturer = capturer
        self.max_graphs = max_graphs
        self.device = device
        self.active = True
        self.pieces: dict[str, Piece] = {}
        self._paths = {id(m): p for p, m in model.named_modules()}
        self._forwards = ReplacedForwards()
        self._split: set[int] = set()
        self._lock = threading.Lock()

    def quiet_context(self) -> bool:
        """No capture running already, no compile tracing, nothing a replay would skip."""
        import torch

        if torch.compiler.is_compiling():
            return False
        if self.device == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        return _plain_context(self.device)

    def wrap(self, module: "torch.nn.Module") -> None:
        path = self._paths.get(id(module), "?")
        if path in self.pieces:
            return
        piece = Piece(self, path, module, module.forward)
        self.pieces[path] = piece
        self._forwards.replace(module, piece)

    def split(self, piece: Piece) -> None:
        """Try ``piece``'s children in its place (once): it is not captured, they may be."""
        with self._lock:
            if id(piece.module) in self._split:
                return
            self._split.add(id(piece.module))
            for child in called_children(piece.module):
                self.wrap(child)

    def undo(self) -> None:
        self.active = False
        self._forwards.restore()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per module path: graphs captured, replays, why it was not captured, fallbacks."""
        return {p: pc.status() for p, pc in self.pieces.items()}

    def replays(self) -> int:
        return sum(pc.replays for pc in self.pieces.values())

    def __enter__(self) -> "Pieces":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def capture_pieces(model: "torch.nn.Module", *, max_graphs: int = 4, capturer: Capturer | None = None,
                   device: str = "cuda") -> Pieces:
    """Replay ``model``'s forward from CUDA graphs, whole where it can be captured, else its
    children's, down to the pieces that can (see the module docstring). Call it on a model in
    eval mode, after ``apply(model, ws, mode="cuda_graph")`` if forge's kernels are to be in the
    graphs; the first calls of each piece run as written and capture it."""
    pieces = Pieces(model, capturer if capturer is not None else CudaCapturer(), max_graphs, device)
    pieces.wrap(model)
    return pieces
