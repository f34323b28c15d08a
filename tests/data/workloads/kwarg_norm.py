"""A norm leaf module whose forward takes a second tensor by keyword (as a rotary embedding takes
its position ids): a module card whose profiled call is ``norm(x, gain=g)``, fp32 (16, 256)."""
import torch
from torch import nn


class GainNorm(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight * gain


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = GainNorm(256)

    def forward(self, x, g):
        return self.norm(x, gain=g)


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs(device="cpu"):
    return [torch.randn(16, 256, device=device), torch.rand(16, 256, device=device) + 0.5]
