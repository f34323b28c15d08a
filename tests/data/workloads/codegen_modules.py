"""Leaf modules written as models write them (Gemma, T5, Llama, Qwen, MoE routers, diffusion
blocks...), each a module card whose program is pointwise ops, views and reductions: the table
tests/test_codegen.py generates kernels for. Small CPU shapes; the dtype of each module is
part of its definition (models mix them)."""

import torch
import torch.nn.functional as F
from torch import nn

B, S, H, NH, D = 2, 8, 64, 4, 16


class GemmaRMSNorm(nn.Module):
    """Gemma: x * (1 + w) in fp32, cast back at the end."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(0.1 * torch.randn(n))

    def forward(self, x):
        o = x.float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        o = o * (1.0 + self.weight.float())
        return o.type_as(x)


class HFRMSNorm(nn.Module):
    """Llama/Qwen: the hand-written rms_norm template's program."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.variance_epsilon = eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(v + self.variance_epsilon)
        return self.weight * h.to(dt)


class QKNorm(HFRMSNorm):
    """Qwen-3's per-head norm: an RMSNorm over head_dim of [B, S, heads, head_dim]."""


class T5LayerNorm(nn.Module):
    """T5: no mean subtraction, no bias; the weight's dtype decides the cast."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class FP32LayerNorm(nn.LayerNorm):
    """OLMo/Cohere style: layer norm computed in fp32, cast back."""

    def forward(self, x):
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps).type_as(x)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """apply_rotary_pos_emb on q [B, heads, S, D] with cos/sin [B, S, D]."""

    def forward(self, q, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (q * cos) + (rotate_half(q) * sin)


class GQARotary(nn.Module):
    """apply_rotary_pos_emb on q and k with fewer k heads (grouped-query attention: Llama 3, Qwen,
    Gemma): two outputs of different sizes, a kernel each."""

    def forward(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class PartialRotary(nn.Module):
    """GPT-NeoX / Phi: rotary on the first 6 of 16 (Phi-2's partial_rotary_factor of 0.4), the rest
    passed through: a concatenation whose second part starts off its own size's multiple."""

    def forward(self, q, cos, sin):
        rot = 6
        q_rot, q_pass = q[..., :rot], q[..., rot:]
        cos, sin = cos[..., :rot].unsqueeze(1), sin[..., :rot].unsqueeze(1)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        return torch.cat((q_rot, q_pass), dim=-1)


class SoftCap(nn.Module):
    """Gemma-2 logit soft-capping."""

    def __init__(self, cap=30.0):
        super().__init__()
        self.cap = cap

    def forward(self, x):
        return torch.tanh(x / self.cap) * self.cap


class SiluGate(nn.Module):
    def forward(self, a, b):
        return F.silu(a) * b


class GeluGate(nn.Module):
    def forward(self, a, b):
        return F.gelu(a, approximate="tanh") * b


class ChunkSwiGLU(nn.Module):
    """One projection holding gate and up, split in the forward."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class ChunkGeGLU(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return a * F.gelu(b)


class RouterMask(nn.Module):
    """MoE routing: scores scaled per expert, masked per token, softmax over experts."""

    def __init__(self, experts):
        super().__init__()
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(experts))

    def forward(self, logits, keep):
        scores = logits * self.scale[None, :]
        scores = scores.masked_fill(~keep[:, None], float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(logits.dtype)


class MaskedScale(nn.Module):
    """Broadcast multiplies and a fill: (x * row_scale) * col_scale, zero where masked."""

    def forward(self, x, row_scale, col_scale, mask):
        y = x * row_scale[:, None] * col_scale[None, :]
        return y.masked_fill(mask, 0.0)


class ContiguousGroupNorm(nn.GroupNorm):
    """nn.GroupNorm on a channels-last tensor, made contiguous first (what the diffusion's
    ``vae_norm_out`` records: a clone, then the group norm)."""

    def forward(self, x):
        return super().forward(x.contiguous())


class HandGroupNorm(nn.Module):
    def __init__(self, groups, channels, eps=1e-5):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x):
        n, c, h, w = x.shape
        g = x.view(n, self.groups, -1)
        mean = g.mean(-1, keepdim=True)
        var = g.var(-1, keepdim=True, unbiased=False)
        g = (g - mean) / torch.sqrt(var + self.eps)
        return g.view(n, c, h, w) * self.weight[None, :, None, None] + self.bias[None, :, None, None]


class GroupNormSiLU(nn.GroupNorm):
    """A diffusion block's norm and activation in one module."""

    def forward(self, x):
        return F.silu(super().forward(x))


class MaskedSoftmax(nn.Module):
    """Attention probabilities: scale, causal mask from triu, softmax in fp32, cast back."""

    def forward(self, scores):
        s = scores.shape[-1]
        mask = torch.full((s, s), float("-inf"), device=scores.device).triu(1)
        return torch.softmax(scores * 0.25 + mask, dim=-1, dtype=torch.float32).to(scores.dtype)


class LogSumExp(nn.Module):
    """A log-partition less the row mean (logsumexp: the row's max shifts it)."""

    def forward(self, x):
        return torch.logsumexp(x, dim=-1) - x.mean(-1)


class L2Normalize(nn.Module):
    def forward(self, x):
        return F.normalize(x, dim=-1)


class Standardize(nn.Module):
    """(x - mean) / std with the unbiased std, two outputs: the standardized rows and the std."""

    def forward(self, x):
        std = x.std(-1, keepdim=True)
        return (x - x.mean(-1, keepdim=True)) / (std + 1e-5), std


class AbsMaxQuant(nn.Module):
    """fp8-style scaling: a row's amax sets its scale; values clamped to the format's range."""

    def forward(self, x):
        scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448.0
        return (x / scale).clamp(-448.0, 448.0), scale


class MinMaxScale(nn.Module):
    def forward(self, x):
        lo = x.amin(-1, keepdim=True)
        hi = x.amax(-1, keepdim=True)
        return (x - lo) / (hi - lo + 1e-6)


class DyT(nn.Module):
    """Dynamic tanh (a norm replacement): w * tanh(alpha * x) + b."""

    def __init__(self, n):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(0.5))
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.bias = nn.Parameter(0.1 * torch.randn(n))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias


class AddRMSNorm(nn.Module):
    """Residual add fused with the norm: returns the new residual and its norm."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps)
        return h, (y * self.weight.float()).to(x.dtype)


class SqueezeExciteRow(nn.Module):
    """Gate each row by a sigmoid of its mean."""

    def forward(self, x):
        return x * torch.sigmoid(x.mean(-1, keepdim=True))


class TransposedMul(nn.Module):
    """A transpose of the last two dims feeding a multiply and an activation."""

    def forward(self, x, y):
        return F.hardswish(x.transpose(-1, -2) * y) + F.mish(y)


class HalfCastChain(nn.Module):
    """fp16 casts: up, scale, down, add, an ELU."""

    def forward(self, x, y):
        return F.elu((x.float() * 2.0).half() + y)


class VarMean(nn.Module):
    """var_mean's two outputs, one a row each, feeding an rsqrt and a scale."""

    def forward(self, x):
        v, m = torch.var_mean(x, dim=-1, keepdim=True)
        return torch.rsqrt(v + 1e-5), m * 2.0


class RopeFrequencies(nn.Module):
    """Llama's rotary embedding (HF): the frequencies as inv_freq @ positions, an outer product
    (a bmm over an inner dimension of 1), then cat, cos and sin, cast to the activations' dtype."""

    def __init__(self, dim=D, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemma_norm = GemmaRMSNorm(H)
        self.gemma_norm_bf16 = GemmaRMSNorm(H).to(torch.bfloat16)
        self.hf_norm = HFRMSNorm(H)
        self.q_norm = QKNorm(D)
        self.t5_norm = T5LayerNorm(H)
        self.t5_norm_bf16 = T5LayerNorm(H).to(torch.bfloat16)
        self.ln32 = FP32LayerNorm(H).to(torch.bfloat16)
        self.rotary = Rotary()
        self.gqa_rotary = GQARotary().to(torch.bfloat16)
        self.partial_rotary = PartialRotary()
        self.softcap = SoftCap()
        self.silu_gate = SiluGate()
        self.gelu_gate = GeluGate()
        self.swiglu = ChunkSwiGLU()
        self.geglu = ChunkGeGLU()
        self.router = RouterMask(8)
        self.masked_scale = MaskedScale()
        self.group_norm = HandGroupNorm(4, 8)
        self.gn_silu = GroupNormSiLU(4, 8)
        self.gn_channels_last = ContiguousGroupNorm(4, 8)
        self.masked_softmax = MaskedSoftmax()
        self.lse = LogSumExp()
        self.l2 = L2Normalize()
        self.standardize = Standardize()
        self.quant = AbsMaxQuant()
        self.minmax = MinMaxScale()
        self.dyt = DyT(H)
        self.add_norm = AddRMSNorm(H)
        self.se_row = SqueezeExciteRow()
        self.transposed = TransposedMul()
        self.half_chain = HalfCastChain()
        self.var_mean = VarMean()
        self.rope = RopeFrequencies()

    def forward(self, x, q, cos, sin, img, keep, mask, scores, xh, yh, pos):
        bf = x.to(torch.bfloat16)
        return [
            self.gemma_norm(x), self.gemma_norm_bf16(bf), self.hf_norm(x), self.q_norm(x.view(B, S, NH, D)),
            self.t5_norm(x), self.t5_norm_bf16(bf), self.ln32(bf), self.rotary(q, cos, sin),
            *self.gqa_rotary(q.bfloat16(), q[:, :2].bfloat16() * 0.5, cos.bfloat16(), sin.bfloat16()),
            self.partial_rotary(q, cos, sin), self.softcap(bf * 40.0), self.silu_gate(x, x * 0.5),
            self.gelu_gate(bf, bf * 2.0), self.swiglu(x), self.geglu(x), self.router(x[:, :8], keep),
            self.masked_scale(x, x[:, 0], x[0], mask), self.group_norm(img), self.gn_silu(img),
            self.gn_channels_last(img.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)),
            self.masked_softmax(scores), self.lse(x), self.l2(x), self.standardize(x), self.quant(x),
            self.minmax(x), self.dyt(x), self.add_norm(x, x * 0.5), self.se_row(x), self.transposed(scores, scores * 2.0),
            self.half_chain(xh, yh), self.var_mean(x), *self.rope(bf, pos),
        ]


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    g = torch.Generator().manual_seed(1)
    rows = B * S
    pos = torch.arange(S, dtype=torch.float32)[None, :, None]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = (pos * inv[None, None, :]).expand(B, S, D // 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return [torch.randn(rows, H, generator=g), torch.randn(B, NH, S, D, generator=g), emb.cos(), emb.sin(),
            torch.randn(2, 8, 4, 4, generator=g), torch.rand(rows, generator=g) < 0.8,
            torch.rand(rows, H, generator=g) < 0.3, torch.randn(B, NH, S, S, generator=g),
            torch.randn(rows, H, generator=g).half(), torch.randn(rows, H, generator=g).half(),
            torch.arange(S)[None, :].expand(B, S).contiguous()]

