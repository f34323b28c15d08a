"""An RMSNorm written as Hugging Face writes it (fp32, eps 1e-6), as a leaf module: the profiler
makes a module card for it. A kernel that drops the epsilon passes on ordinary inputs and fails on
all-zero or tiny rows."""
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
        return self.weight * x.to(dtype)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(256)

    def forward(self, x):
        return self.norm(x)


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    return [torch.randn(16, 256)]
