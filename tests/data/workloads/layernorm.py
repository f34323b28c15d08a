"""An fp32 nn.LayerNorm over (16, 256): a kernel computing the variance in one pass as
E[x^2] - E[x]^2 passes on ordinary inputs and fails on inputs with a large common offset."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(256)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(256))
            self.norm.bias.copy_(0.1 * torch.randn(256))

    def forward(self, x):
        return self.norm(x)


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    return [torch.randn(16, 256)]
