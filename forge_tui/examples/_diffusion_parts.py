"""Stable-Diffusion-style blocks (UNet ResNet block, spatial transformer, VAE block), as diffusers writes them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DiffusionConfig:
    channels: int = 320
    size: int = 64  # latent height = width
    batch: int = 2
    temb: int = 1280
    context_len: int = 77
    context_dim: int = 768
    heads: int = 8
    groups: int = 32
    vae_channels: int = 512
    vae_size: int = 128
    vae_batch: int = 1


class ResnetBlock2D(nn.Module):
    def __init__(self, channels: int, groups: int, temb: int | None, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, channels) if temb else None
        self.norm2 = nn.GroupNorm(groups, channels, eps=eps, affine=True)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.nonlinearity = nn.SiLU()

    def forward(self, x, temb=None):
        h = self.nonlinearity(self.norm1(x))
        h = self.conv1(h)
        if self.time_emb_proj is not None and temb is not None:
            h = h + self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        h = self.nonlinearity(self.norm2(h))
        h = self.conv2(self.dropout(h))
        return x + h


class CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int, context_dim: int | None = None) -> None:
        super().__init__()
        context_dim = context_dim or dim
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        context = x if context is None else context
        b, n, d = x.shape
        q = self.to_q(x).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        k = self.to_k(context).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        v = self.to_v(context).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


class GEGLU(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x):
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(gate)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, context_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = CrossAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = CrossAttention(dim, heads, context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff_in = GEGLU(dim, dim * 4)
        self.ff_out = nn.Linear(dim * 4, dim)

    def forward(self, x, context):
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff_out(self.ff_in(self.norm3(x)))


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, groups: int, heads: int, context_dim: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6, affine=True)
        self.proj_in = nn.Linear(channels, channels)
        self.block = TransformerBlock(channels, heads, context_dim)
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x, context):
        b, c, h, w = x.shape
        residual = x
        x = self.norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c)
        x = self.proj_out(self.block(self.proj_in(x), context))
        return x.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous() + residual


class VAEAttention(nn.Module):
    """The VAE mid-block attention: GroupNorm, then single-head attention with explicit softmax."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=1e-6, affine=True)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.Linear(channels, channels)
        self.scale = channels**-0.5

    def forward(self, x):
        b, c, h, w = x.shape
        hs = self.group_norm(x).view(b, c, h * w).transpose(1, 2)
        q, k, v = self.to_q(hs), self.to_k(hs), self.to_v(hs)
        probs = torch.softmax(torch.baddbmm(
            torch.empty(b, h * w, h * w, dtype=q.dtype, device=q.device), q, k.transpose(1, 2),
            beta=0, alpha=self.scale), dim=-1)
        out = self.to_out(torch.bmm(probs, v))
        return out.transpose(1, 2).reshape(b, c, h, w) + x


class DiffusionStep(nn.Module):
    """One UNet down-block stage (2x ResNet + spatial transformer) and one VAE decoder stage."""

    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        self.res1 = ResnetBlock2D(cfg.channels, cfg.groups, cfg.temb)
        self.attn1 = SpatialTransformer(cfg.channels, cfg.groups, cfg.heads, cfg.context_dim)
        self.res2 = ResnetBlock2D(cfg.channels, cfg.groups, cfg.temb)
        self.attn2 = SpatialTransformer(cfg.channels, cfg.groups, cfg.heads, cfg.context_dim)
        self.downsample = nn.Conv2d(cfg.channels, cfg.channels, 3, stride=2, padding=1)
        self.vae_res = ResnetBlock2D(cfg.vae_channels, cfg.groups, None, eps=1e-6)
        self.vae_attn = VAEAttention(cfg.vae_channels, cfg.groups)
        self.vae_norm_out = nn.GroupNorm(cfg.groups, cfg.vae_channels, eps=1e-6)
        self.vae_act = nn.SiLU()

    def forward(self, sample, temb, context, vae_features):
        h = self.attn1(self.res1(sample, temb), context)
        h = self.attn2(self.res2(h, temb), context)
        h = self.downsample(h)
        v = self.vae_attn(self.vae_res(vae_features))
        v = self.vae_act(self.vae_norm_out(v))
        return h, v


def init_random(model: nn.Module) -> nn.Module:
    """Default (Kaiming) matrices, small random biases, norm scales near one."""
    for p in model.parameters():
        if p.dim() == 1:
            nn.init.normal_(p, mean=0.0, std=0.1)
    for m in model.modules():
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)) and m.weight is not None:
            nn.init.normal_(m.weight, mean=1.0, std=0.1)
    return model


def diffusion_inputs(cfg: DiffusionConfig):
    return [
        torch.randn(cfg.batch, cfg.channels, cfg.size, cfg.size),
        torch.randn(cfg.batch, cfg.temb),
        torch.randn(cfg.batch, cfg.context_len, cfg.context_dim),
        torch.randn(cfg.vae_batch, cfg.vae_channels, cfg.vae_size, cfg.vae_size),
    ]
