"""CPU-sized MLP block with LayerNorm, GELU, residual and a softmax head (fp32)."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256, classes: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.norm(x))))
        x = x + h
        return torch.softmax(self.head(x), dim=-1)


def get_model():
    return Block()


def get_inputs():
    return [torch.randn(8, 16, 64)]
