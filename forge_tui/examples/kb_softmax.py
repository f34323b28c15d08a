"""A KernelBench level-1 style problem, unchanged format: Model, get_inputs, get_init_inputs."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a Softmax activation."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=self.dim)


batch_size = 16
dim = 512


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [-1]
