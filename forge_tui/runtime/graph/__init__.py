"""Serving op and chain cards in a module's forward compiled to an aten graph, at eager's cost.

The interceptor (``intercept.interceptor_class``) sees a scope's ops one by one through a Python
dispatch mode: every op of the scope pays a trip through Python, which can cost a forward more
host time than its kernels save on the device.
Here the scope's forward is compiled once by torch.compile (Dynamo, then AOTAutograd's inference
graph: the same aten ops the profiler recorded), each card's ops are found in the aten graph and
replaced by one call of the card's guarded kernel, and a graph runs as eager code would, op by op
with no mode. The graph that runs is Dynamo's own, torch calls as the forward makes them, with the
calls that made the card's ops replaced (``rewrite_torch_level``): it costs the host about what
eager's forward does, where the aten graph, whose every op is a Python call of its own, costs
more. A site whose ops are not whole torch calls is left as the
forward computes it (``GraphScope.unmapped``); where those would save more, or the forward makes an
in-place call, the aten graph runs. A chain's intermediates are replaced only where nothing else in
the graph reads them (the graph knows every reader), so no value is deferred.

Dynamo's guards decide when the graph stands for the forward (the same code, module attributes,
shapes, dtypes, grad mode); where they fail it compiles again, and where it cannot (its cache limit,
code it cannot trace) it runs the forward as Python. Each scope compiles a copy of its forward's
code object, so successive ``apply`` calls never share (or exhaust) one cache; a model's alike
scopes (its layers: one forward's code, the same cards, nothing forge replaced below them) compile
one copy together, Dynamo taking each layer's parameters as the graph's inputs, so a compile
serves every layer (``VariantBook.shared``). A scope
compiles few variants (``GraphScope.MAX_VARIANTS``; the cards serve the shapes they were profiled
at, and a generation loop meets new ones at every step), and alike scopes share what their compiles
found (``VariantBook``): a call no variant that serves covers runs as written. A call
that needs gradients, or comes while the scope cannot be compiled, runs the original forward. A
kernel call that the guard refuses (or that fails) computes the card's own aten program instead,
eager's ops on the same inputs.

Here: ``matching`` finds a card's program in a graph and replaces it; ``callkeys`` keys a call by
its tensors' specs; ``scope`` compiles a scope's forward (``GraphScope``); ``backend`` serves op
and chain cards in a model the user compiles (``CompileBackend``).
"""

from .backend import REDUCING_OPS, CompileBackend, compile_worthy
from .callkeys import Leads, call_key, call_lead, key_text
from .matching import find, rewrite, rewrite_torch_level
from .scope import GraphScope, VariantBook, compilable

__all__ = ["REDUCING_OPS", "CompileBackend", "GraphScope", "Leads", "VariantBook", "call_key", "call_lead", "compilable",
           "compile_worthy", "find", "key_text", "rewrite", "rewrite_torch_level"]
