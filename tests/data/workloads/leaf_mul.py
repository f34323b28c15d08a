"""A user's own leaf module whose forward is one op, `a * b`, called with the same tensor twice
(`self.m(x, x)`): its op card, `mul` of one tensor by itself, has one input. The module says its
forward reads nothing but its call's tensors (`forge_direct`), so the runtime may learn it."""
import torch
from torch import nn


class Mul(nn.Module):
    forge_direct = True

    def forward(self, a, b):
        return a * b


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = Mul()

    def forward(self, x):
        return self.m(x, x)


def get_model():
    return Model().eval()


def get_inputs():
    torch.manual_seed(0)
    return [torch.randn(64, 256)]
