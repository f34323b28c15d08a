"""Two alike fp32 layers, each a linear then a softmax in its own forward (an op card served in
each layer's compiled scope), over one (16, 64) input: the scopes share what their compiles find
(``graph.VariantBook``)."""
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    return [torch.randn(16, 64)]
