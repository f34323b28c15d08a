"""A model whose served calls depend on attributes: an RMSNorm leaf module (a module card) whose
forward reads its eps and its training flag, and a softmax called in the top module's own forward
(an op card outside any leaf module) over the model's ``dim``, fp32 (16, 256)."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        out = self.weight * x.to(dtype)
        if self.training:  # as a dropout does, the forward computes something else in training
            out = out * 0.5
        return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(256)
        self.dim = -1

    def forward(self, x):
        return torch.softmax(self.norm(x), dim=self.dim)


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs(device="cpu"):
    return [torch.randn(16, 256, device=device)]
