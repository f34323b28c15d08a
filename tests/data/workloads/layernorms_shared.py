"""Three fp32 nn.LayerNorm(256) leaf modules over one (16, 256) input: one op card, native_layer_norm,
served in three leaf modules, each of which learns its site on its own calls."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(256) for _ in range(3))

    def forward(self, x):
        return [norm(x) for norm in self.norms]


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    return [torch.randn(16, 256)]
