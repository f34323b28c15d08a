"""How greedy generation drives a causal language model: one adapter per kind of model.

- ``ExampleAdapter``: forge's own example decoders (``examples/_decoder_parts.Decoder``), whose
  forward takes ``past_key_values`` (a ``StaticKV`` or ``DynamicKV``) and ``cache_position``.
- ``HFAdapter``: a Hugging Face ``transformers`` causal LM (``GenerationMixin``), with its own
  ``StaticCache``; its eager generation is ``model.generate(do_sample=False)``.

Each adapter gives the runner the same few calls: a static cache for a batch, a prefill over a
prompt, and a decode step that reads its token and position from device tensors (so that it can
be captured in a CUDA graph: no host value enters it), each returning the last position's logits.
``call`` is what runs the model's forward: the module itself, or a ``torch.compile`` of its
forward (``with_forward``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch import nn

from ..errors import ForgeError
from .cache import DynamicKV, StaticKV


def _params_read(model: nn.Module, batch: int) -> int:
    """Bytes of parameters a decode step of ``batch`` tokens reads: every parameter, except an
    embedding table used only for its lookup (``batch`` rows of it are read); one that another
    module also uses (an lm_head tied to it) is read whole. Routed experts are counted by the
    caller (``expert_share``)."""
    lookups = {id(m.weight): m for m in model.modules() if isinstance(m, nn.Embedding)}
    used_elsewhere = {id(p) for m in model.modules() if not isinstance(m, nn.Embedding)
                      for p in m.parameters(recurse=False)}
    total = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in lookups and id(p) not in used_elsewhere:
            total += min(batch, p.shape[0]) * p[0].numel() * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


class ExampleAdapter:
    """forge's example decoder (``Decoder`` of ``examples/_decoder_parts.py``)."""

    kind = "forge example"

    def __init__(self, model: nn.Module, call: Callable[..., Any] | None = None) -> None:
        self.model = model
        self.call = call if call is not None else model
        self.cfg: Any = model.cfg  # the example's DecoderConfig

    def with_forward(self, call: Callable[..., Any]) -> "ExampleAdapter":
        return ExampleAdapter(self.model, call)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def vocab(self) -> int:
        return int(self.cfg.vocab)

    def static_cache(self, batch: int, max_len: int) -> StaticKV:
        c = self.cfg
        return StaticKV(c.layers, batch, c.kv_heads, max_len, c.head_dim, dtype=self.dtype, device=self.device)

    def reset(self, cache: StaticKV) -> None:
        cache.reset()

    def rewind(self, cache: StaticKV, at: int | torch.Tensor) -> None:
        """The next step writes slot ``at``: the example's cache writes where the step's positions
        say, so there is nothing to move."""

    def why_not_static(self) -> str | None:
        return None

    def prefill(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.call(ids, past_key_values=cache, cache_position=positions)[:, -1, :]

    def prefill_at(self, ids: torch.Tensor, last: torch.Tensor, cache: Any) -> torch.Tensor:
        """A prefill over ``ids`` (a prompt padded on the right) that returns the logits of
        position ``last`` (a device tensor ``[1]``: no host value enters it)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.call(ids, past_key_values=cache, cache_position=positions, logits_to_keep=last)[:, -1, :]

    def decode(self, ids: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.call(ids, past_key_values=cache, cache_position=pos)[:, -1, :]

    def eager_generate(self, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The example's own greedy loop: a cache that grows by concatenation (``DynamicKV``),
        the next token chosen on the device, no host sync between steps."""
        cache = DynamicKV(self.cfg.layers)
        prompt = ids.shape[1]
        logits = self.call(ids, past_key_values=cache, cache_position=torch.arange(prompt, device=ids.device))
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        out = [nxt]
        for t in range(1, new_tokens):
            pos = torch.arange(prompt + t - 1, prompt + t, device=ids.device)
            nxt = self.call(nxt, past_key_values=cache, cache_position=pos)[:, -1, :].argmax(-1, keepdim=True)
            out.append(nxt)
        return torch.cat(out, dim=1)

    def static_generate(self, ids: torch.Tensor, new_tokens: int, max_len: int | None = None) -> torch.Tensor:
        """Greedy tokens over a static cache of ``max_len`` slots (default: just enough), a plain
        loop (what ``torch.compile`` runs)."""
        cache = self.static_cache(ids.shape[0], max_len or ids.shape[1] + new_tokens)
        nxt = self.prefill(ids, cache).argmax(-1, keepdim=True)
        out = [nxt]
        pos = torch.full((1,), ids.shape[1], dtype=torch.long, device=ids.device)
        for _ in range(1, new_tokens):
            nxt = self.decode(nxt, pos, cache).argmax(-1, keepdim=True)
            out.append(nxt)
            pos = pos + 1
        return torch.cat(out, dim=1)

    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Every position's logits from the model's full forward (no cache), through ``call``."""
        return self.call(ids)[0]

    def weight_bytes(self, batch: int) -> int:
        """Bytes of weights a decode step of ``batch`` sequences reads: routed experts only as
        many as ``batch`` x top-k can select."""
        total = _params_read(self.model, batch)
        c = self.cfg
        if c.experts:
            layers: Any = self.model.layers
            experts = sum(p.numel() * p.element_size() for layer in layers for p in layer.mlp.experts.parameters())
            total -= int(experts * (1 - min(1.0, batch * c.top_k / c.experts)))
        return total

    def kv_bytes_per_token(self) -> int:
        c = self.cfg
        return 2 * c.layers * c.kv_heads * c.head_dim * torch.finfo(self.dtype).bits // 8


class HFAdapter:
    """A Hugging Face causal LM (``transformers``' ``GenerationMixin``)."""

    kind = "transformers"

    def __init__(self, model: nn.Module, call: Callable[..., Any] | None = None) -> None:
        import inspect

        self.model = model
        self.call = call if call is not None else model
        # transformers 5.2x renames the forward's ``past_key_values`` to ``cache`` (the old name
        # still accepted, with a warning at every call)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self._slots: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        """Each static cache's slot count, by cache (shared with the adapters ``with_forward`` makes)."""

    def with_forward(self, call: Callable[..., Any]) -> "HFAdapter":
        other = HFAdapter(self.model, call)
        other._slots = self._slots
        return other

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def vocab(self) -> int:
        return int(self.config.get_text_config(decoder=True).vocab_size)

    def why_not_static(self) -> str | None:
        if not getattr(self.model, "_can_compile_fullgraph", True):
            return f"{type(self.model).__name__} does not support a static cache (transformers' _can_compile_fullgraph)"
        return None

    def static_cache(self, batch: int, max_len: int) -> Any:
        from transformers import StaticCache

        cache = StaticCache(config=self.config, max_cache_len=max_len)
        self._slots[cache] = max_len  # its slots, which the step's mask covers (no API of it across 5.x)
        return cache

    def reset(self, cache: Any) -> None:
        cache.reset()  # in place: the buffers stay where a captured graph reads them

    def rewind(self, cache: Any, at: int | torch.Tensor) -> None:
        """The next step writes slot ``at`` (a number, or a device tensor ``[1]``, which a captured
        prefill copies from): a transformers static cache keeps its own write position per layer
        (``cumulative_length``, a tensor once the layer has been written)."""
        for layer in getattr(cache, "layers", ()):
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                if isinstance(at, torch.Tensor):
                    length.copy_(at.reshape(length.shape))
                else:
                    length.fill_(at)
            elif length is not None:
                if isinstance(at, torch.Tensor):
                    raise ForgeError("a cache layer not written yet keeps its position on the host: run a prefill first")
                layer.cumulative_length = at

    def prefill(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.call(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})
        return out.logits[:, -1, :]

    def _mask(self, pos: torch.Tensor, batch: int, kv_length: int) -> torch.Tensor:
        """The 4-D mask of queries at positions ``pos`` (``[queries]``) over a static cache's
        slots, made on the device (Hugging Face takes a 4-D mask as it is, without the mask code
        that reads it back)."""
        seen = (torch.arange(kv_length, device=pos.device)[None, :] <= pos[:, None])[None, None].expand(batch, 1, -1, -1)
        if getattr(self.config, "_attn_implementation", "sdpa") == "sdpa":
            return seen
        low = torch.full((), torch.finfo(self.dtype).min, dtype=self.dtype, device=pos.device)
        return torch.where(seen, torch.zeros((), dtype=self.dtype, device=pos.device), low)

    def prefill_at(self, ids: torch.Tensor, last: torch.Tensor, cache: Any) -> torch.Tensor:
        """A prefill over ``ids`` (a prompt padded on the right) that returns the logits of
        position ``last`` (a device tensor ``[1]``): positions and the causal mask are made on the
        device, as the decode step's are, so that it can be captured."""
        batch, length = ids.shape
        pos = torch.arange(length, device=ids.device)
        mask = self._mask(pos, batch, self._slots[cache])
        out = self.call(input_ids=ids, use_cache=True, logits_to_keep=last, position_ids=pos[None, :].expand(batch, -1),
                        attention_mask=mask, **{self.cache_kw: cache})
        return out.logits[:, -1, :]

    def decode(self, ids: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        batch = ids.shape[0]
        mask = self._mask(pos, batch, self._slots[cache])
        out = self.call(input_ids=ids, use_cache=True, logits_to_keep=1, position_ids=pos[None, :].expand(batch, 1),
                        attention_mask=mask, **{self.cache_kw: cache})
        return out.logits[:, -1, :]

    def _generate(self, ids: torch.Tensor, new_tokens: int, **kw: Any) -> torch.Tensor:
        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,  # type: ignore[operator]
                                  do_sample=False, **kw)
        return out[:, ids.shape[1]:]

    def eager_generate(self, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """``model.generate`` with its default (dynamic) cache, greedy."""
        return self._generate(ids, new_tokens)

    def static_generate(self, ids: torch.Tensor, new_tokens: int, max_len: int | None = None) -> torch.Tensor:
        """``model.generate`` with a static cache and the forward as it is now (compiled by the
        caller: Hugging Face's documented fast path), without generate's own compile on top. With
        ``max_len``, the cache is a ``StaticCache`` of that many slots passed in (so that every
        generation of a batch, however many tokens it asks for, runs the same shapes)."""
        if max_len is not None:
            return self._generate(ids, new_tokens, past_key_values=self.static_cache(ids.shape[0], max_len),
                                  disable_compile=True)
        return self._generate(ids, new_tokens, cache_implementation="static", disable_compile=True)

    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits

    def weight_bytes(self, batch: int) -> int:
        return _params_read(self.model, batch)

    def kv_bytes_per_token(self) -> int:
        c = self.config.get_text_config(decoder=True)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return 2 * c.num_hidden_layers * kv_heads * head_dim * torch.finfo(self.dtype).bits // 8


Adapter = ExampleAdapter | HFAdapter


def _is_hf(model: Any) -> bool:
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    return isinstance(model, GenerationMixin)


def generating_module(model: nn.Module) -> nn.Module:
    """The module that generates: ``model`` itself, or the causal LM a workload wraps (its
    ``model`` attribute, as ``examples/_hf_parts.Logits`` holds it)."""
    if _is_hf(model) or hasattr(model, "_cached"):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module) and _is_hf(inner):
        return inner
    raise ForgeError(f"{type(model).__name__} cannot generate: expected a transformers causal LM "
                     "(GenerationMixin) or a forge example decoder")


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter of ``model`` (or of the causal LM it wraps: ``generating_module``)."""
    gen = generating_module(model)
    return HFAdapter(gen) if _is_hf(gen) else ExampleAdapter(gen)
