"""Op and chain cards served in the graphs of a model compiled with ``Applied.backend()``."""

from __future__ import annotations

from typing import Any, Callable

from .matching import rewrite

REDUCING_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "logsumexp", "norm",
    "linalg_vector_norm", "prod", "cumsum", "_softmax", "_log_softmax", "native_layer_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "avg_pool2d",
    "max_pool2d_with_indices", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
})
"""Ops that read a row, a group or a window to write one value: what torch.compile cannot fuse as
freely as a pointwise op. A card under torch.compile needs one (``compile_worthy``). A batch norm
reduces only in training (``_TRAINING_ARG``); in inference it is a per-channel affine map."""


_TRAINING_ARG = {"native_batch_norm": 5, "_native_batch_norm_legit": 5}
"""Where a batch norm's ``training`` flag is among its arguments."""


def compile_worthy(program: dict) -> str | None:
    """Why a card's program is not served inside a torch.compile'd graph, or None. Pointwise
    programs are not: inductor fuses them into their neighbours' kernels, and an opaque kernel in
    their place would stop that (a batch norm in inference fused with the ReLU or the residual
    sum after it is faster than a faster batch norm kernel and those ops apart)."""
    for node in program.get("nodes", []):
        parts = str(node.get("op", "")).split(".")
        name = parts[1] if len(parts) > 1 else parts[0]
        if name in REDUCING_OPS:
            at, args = _TRAINING_ARG.get(name), node.get("args") or []
            if at is None or len(args) <= at or args[at] is not False:
                return None
    return "pointwise: torch.compile fuses it into its neighbours, where an opaque kernel would stop that"


class CompileBackend:
    """A torch.compile backend that serves op and chain cards inside the compiled graphs of one
    ``apply`` (``Applied.backend``): each graph Dynamo hands it is traced to aten ops by
    AOTAutograd with no decomposition (the ops the profiler recorded), each card's ops are found
    (``find``) and replaced by the card's custom op, and the graph goes on to the inner backend
    (inductor by default), which decomposes and fuses what is left and keeps each kernel as one
    opaque node. A graph with no card in it goes to the inner backend as Dynamo traced it. Graphs
    that need gradients are not rewritten (kernels serve inference)."""

    def __init__(self, guards: list[Any], device: str, opaque: Callable[[Any], Any], inner: str = "inductor") -> None:
        self.guards = guards
        self.device = device
        self.opaque = opaque
        self.inner = inner
        self.sites: dict[str, int] = {}
        """Per card, the sites replaced in the graphs compiled so far."""
        self.failed: list[str] = []
        """Why graphs went to the inner backend unrewritten (a rewrite that raised)."""

    def _inner(self) -> Any:
        from torch._dynamo import lookup_backend

        return lookup_backend(self.inner)

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        import torch._guards
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        if not any(g.status.active for g in self.guards):
            return self._inner()(gm, example_inputs)
        found: dict[str, int] = {}

        def inference(agm: Any, inputs: Any) -> Any:
            try:
                found.update(rewrite(agm, self.guards, self.device, self.opaque))
            except Exception as exc:  # noqa: BLE001 - the graph as Dynamo traced it is still right
                self.failed.append(f"{type(exc).__name__}: {exc}")
                found.clear()
            if not found:
                return make_boxed_func(agm.forward)  # discarded: Dynamo's graph goes on instead
            from torch.fx.graph import CodeGen

            agm.graph.set_codegen(CodeGen())  # positional arguments, as Dynamo's graphs take them
            agm.recompile()
            with torch._guards.tracing(None):  # the inner backend traces this graph afresh
                compiled = self._inner()(agm, list(inputs))
            return make_boxed_func(compiled)  # a backend's result takes positional arguments

        def training(agm: Any, inputs: Any) -> Any:
            return make_boxed_func(agm.forward)

        traced = aot_autograd(fw_compiler=training, inference_compiler=inference)(gm, example_inputs)
        if not found:
            return self._inner()(gm, example_inputs)
        for card, n in found.items():
            self.sites[card] = self.sites.get(card, 0) + n
        return traced
