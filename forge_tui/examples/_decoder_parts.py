"""Building blocks of the decoder examples, written the way Hugging Face models write them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DecoderConfig:
    layers: int = 8
    hidden: int = 1536
    heads: int = 12
    kv_heads: int = 4
    head_dim: int = 128
    intermediate: int = 6144
    vocab: int = 262144
    act: str = "gelu_tanh"  # gated MLP activation: "gelu_tanh" (Gemma) or "silu" (Llama/Qwen)
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention: str = "eager"  # "eager" (explicit softmax, as HF eager) or "sdpa"
    qk_norm: bool = False  # Qwen-3 normalises q and k per head
    experts: int = 0  # 0: dense MLP; otherwise a routed mixture of experts
    top_k: int = 0
    expert_intermediate: int = 0
    sample_positions: int = 128  # next-token distributions computed for the last N positions
    embed_scale: bool = True  # Gemma multiplies embeddings by sqrt(hidden)


class RMSNorm(nn.Module):
    """HF-style RMSNorm: upcast, pow, mean, rsqrt, mul, cast back, scale (six tensor ops)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq_buf: torch.Tensor = self.inv_freq  # type: ignore[assignment]  # a registered buffer
        inv_freq = inv_freq_buf[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv_freq @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, kv_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, slen, head_dim)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx  # which of a KV cache's layers this attention writes
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
        self.scaling = cfg.head_dim**-0.5

    def forward(self, x, cos, sin, mask, cache=None, positions=None):
        cfg = self.cfg
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, -1, cfg.head_dim)
        k = self.k_proj(x).view(bsz, seq, -1, cfg.head_dim)
        v = self.v_proj(x).view(bsz, seq, -1, cfg.head_dim).transpose(1, 2)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:  # generation: this step's keys and values join the cache's
            k, v = cache.update(self.layer_idx, k, v, positions)
        n_rep = cfg.heads // cfg.kv_heads
        if cfg.attention == "sdpa" and cache is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
        elif cfg.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
        else:
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
            scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
            scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, v)
        out = out.transpose(1, 2).reshape(bsz, seq, -1)
        return self.o_proj(out)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = act

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.act == "gelu_tanh" else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class SparseMoE(nn.Module):
    """Routed experts written as Hugging Face's Qwen-MoE eager code writes them."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.num_experts = cfg.experts
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = nn.ModuleList(
            GatedMLP(cfg.hidden, cfg.expert_intermediate, cfg.act) for _ in range(cfg.experts)
        )

    def forward(self, hidden_states):
        bsz, seq, hidden = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros_like(hidden_states)
        expert_mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in hit.flatten().tolist():
            idx, top_x = torch.where(expert_mask[expert_idx])
            current = hidden_states[None, top_x].reshape(-1, hidden)
            out = self.experts[expert_idx](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, out.to(hidden_states.dtype))
        return final.reshape(bsz, seq, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = SparseMoE(cfg) if cfg.experts else GatedMLP(cfg.hidden, cfg.intermediate, cfg.act)

    def forward(self, x, cos, sin, mask, cache=None, positions=None):
        if cache is None:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        else:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, past_key_values=None, cache_position=None, logits_to_keep=None):
        """Without a cache: the whole sequence's logits and the next-token distributions of its
        last ``sample_positions`` positions. With ``past_key_values`` (a ``StaticKV`` or
        ``DynamicKV`` of ``forge_tui.generation.cache``) and ``cache_position`` (the positions of
        ``input_ids``' tokens, a 1-D device tensor): the tokens' keys and values are written to the
        cache, and only the last position's logits ``[batch, 1, vocab]`` are returned, or, as
        Hugging Face's ``logits_to_keep`` tensor says, those of the positions it lists (a prompt
        padded to a fixed length keeps its last real position's)."""
        if past_key_values is not None:
            return self._cached(input_ids, past_key_values, cache_position, logits_to_keep)
        cfg = self.cfg
        bsz, seq = input_ids.shape
        x = self.embed_tokens(input_ids)
        if cfg.embed_scale:
            x = x * torch.tensor(math.sqrt(cfg.hidden), dtype=x.dtype, device=x.device)
        positions = torch.arange(seq, device=x.device)[None, :].expand(bsz, -1)
        cos, sin = self.rotary_emb(x, positions)
        mask = torch.full((seq, seq), torch.finfo(x.dtype).min, device=x.device, dtype=x.dtype).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        logits = self.lm_head(x)
        tail = logits[:, -cfg.sample_positions :, :]
        probs = F.softmax(tail, dim=-1, dtype=torch.float32)
        return logits, probs

    def _cached(self, input_ids: torch.Tensor, cache, positions: torch.Tensor, keep=None) -> torch.Tensor:
        """One generation step over a KV cache. Every tensor it makes comes from device tensors
        (the embedding scale is filled on the device, not copied from the host), so a static
        cache's step can be captured in a CUDA graph."""
        cfg = self.cfg
        bsz, _ = input_ids.shape
        x = self.embed_tokens(input_ids)
        if cfg.embed_scale:  # the value the full forward multiplies by, rounded to x's dtype alike
            x = x * torch.full((), math.sqrt(cfg.hidden), dtype=x.dtype, device=x.device)
        cos, sin = self.rotary_emb(x, positions[None, :].expand(bsz, -1))
        mask = cache.mask(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache, positions)
        x = self.norm(x[:, -1:, :] if keep is None else x.index_select(1, keep))
        return self.lm_head(x)


def init_random(model: nn.Module, std: float = 0.02) -> nn.Module:
    """Random weights with a spread that keeps activations O(1); norm weights near one."""
    for p in model.parameters():
        if p.dim() == 1:
            nn.init.normal_(p, mean=1.0, std=0.1)
        else:
            nn.init.normal_(p, std=std)
    return model


def decoder_inputs(cfg: DecoderConfig, batch: int, seq: int):
    return [torch.randint(0, cfg.vocab, (batch, seq))]
