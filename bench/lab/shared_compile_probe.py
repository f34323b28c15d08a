"""Asks: could a model's alike compiled scopes (its layers' attentions: one forward's code, the same
cards) share one Dynamo compile instead of one each? Each scope compiles a private copy of its
forward's code object today, so a model of N layers pays N compiles at its first forward (and the
bench pays them again in every copy it applies). With parameters as graph inputs (Dynamo inlines
nn modules), one copy shared by the layers compiles once if nothing else its guards read differs
between layers (an attribute such as a layer index or a sliding window would make a variant each).

    python bench/lab/shared_compile_probe.py [--layers 4]

CPU, eager backend (counts Dynamo's compiles, not inductor's): a plain attention module, then
Hugging Face's Llama and Gemma-3 attention layers (random weights, their configurations' CPU
sizes with ``--layers`` layers), each layer's forward called with the arguments the model passed
it, through one shared copy of the forward's code and through a copy each. Prints the compiles and
the first calls' wall time; JSON to $OUT if set.

Answer (2026-12-05, the development machine's CPU, torch 2.13.0, transformers 5.25, 8 layers, two
runs): one shared copy compiled once for all 8 layers of each kind, a copy each 8 times: the plain
attention 0.05 s against 0.36-0.38, Hugging Face's Llama attention 0.17-0.18 against 1.06-1.07,
Gemma-3's (sliding and full layers alike) 0.19 against 1.00-1.03 (eager backend; forge's scopes
add AOTAutograd and the rewrite to each compile). The runtime shares one copy among alike scopes
since `66ac99b` (``graph.VariantBook.shared``): the scopes' bookkeeping (variants, sites, the
direct call's variant) kept per book, one backend for the copy (Dynamo guards on the backend too),
and scopes left out whose subtrees hold forwards forge replaced (a module card's, a child scope's)
or module hooks, which Dynamo guards per module (a variant per layer in one cache reaches its
limit of 8); a layer that compiles again for a call like an alike one's ends the sharing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def innermost(f: Any) -> Any:
    while isinstance(getattr(f, "__wrapped__", None), types.FunctionType):
        f = f.__wrapped__
    return f


def compiles(layers: list[Any], calls: list[tuple[tuple[Any, ...], dict[str, Any]]], shared: bool) -> dict[str, Any]:
    import torch

    count: list[int] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        count.append(1)
        return gm.forward

    f = innermost(type(layers[0]).forward)

    def copy() -> Any:
        c = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        c.__kwdefaults__ = f.__kwdefaults__
        return c

    one = copy()
    torch._dynamo.reset()
    t0 = time.perf_counter()
    with torch.no_grad():
        for layer, (args, kwargs) in zip(layers, calls):
            fn = torch.compile(types.MethodType(one if shared else copy(), layer), backend=backend, dynamic=False)
            fn(*args, **kwargs)
    return {"compiles": len(count), "first_calls_s": time.perf_counter() - t0}


def captured(model: Any, run: Any, cls_name: str) -> tuple[list[Any], list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    """The modules of class ``cls_name`` and the arguments ``run()`` called each with."""
    layers = [m for m in model.modules() if type(m).__name__ == cls_name]
    calls: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = [m.register_forward_pre_hook(lambda m, a, k: calls.setdefault(id(m), (a, k)) and None, with_kwargs=True)
               for m in layers]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return layers, [calls[id(m)] for m in layers]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    import torch
    from torch import nn

    torch.set_num_threads(1)
    rows = {}

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.scale = nn.Linear(64, 64), nn.Linear(64, 64), 0.125

        def forward(self, x: Any) -> Any:
            return torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) * self.scale, -1)

    plain = [Attn() for _ in range(a.layers)]
    x = torch.randn(8, 64)
    compiles(plain[:1], [((x,), {})], False)  # Dynamo's own first-use cost, left out of the rows
    rows["plain attention"] = {k: compiles(plain, [((x,), {})] * a.layers, k == "shared") for k in ("shared", "each")}
    sys.path.insert(0, str(ROOT / "bench" / "workloads"))
    for name, module_name, cls_name in (("hf llama attention", "hf_llama", "LlamaAttention"),
                                        ("hf gemma3 attention", "hf_gemma3", "Gemma3Attention")):
        try:
            wl = __import__(module_name)
        except ImportError as exc:
            rows[name] = {"error": str(exc)}
            continue
        cfg = wl._config("cpu")
        cfg.num_hidden_layers = a.layers
        if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
            cfg.layer_types = [cfg.layer_types[i % len(cfg.layer_types)] for i in range(a.layers)]
        from forge_tui.examples._hf_parts import causal_lm

        cls = {"hf_llama": "LlamaForCausalLM", "hf_gemma3": "Gemma3ForCausalLM"}[module_name]
        import transformers

        model = causal_lm(getattr(transformers, cls), cfg, "cpu")
        ids = wl.get_inputs("cpu")[0]
        with torch.no_grad():
            layers, calls = captured(model, lambda m=model, i=ids: m(i), cls_name)
        rows[name] = {k: compiles(layers, calls, k == "shared") for k in ("shared", "each")}
    print(f"{a.layers} layers; Dynamo compiles (eager backend) and the first calls' wall time")
    for name, r in rows.items():
        if "error" in r:
            print(f"  {name:22s} {r['error']}")
            continue
        print(f"  {name:22s} shared copy: {r['shared']['compiles']} compiles, {r['shared']['first_calls_s']:.2f} s;  "
              f"a copy each: {r['each']['compiles']} compiles, {r['each']['first_calls_s']:.2f} s")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "shared_compile_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
