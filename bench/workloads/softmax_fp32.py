"""Bench workload: a row softmax in fp32, 8192 rows of 4096 (128 MiB in, 128 MiB out)."""
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_model():
    return Model()


def get_inputs(device="cpu"):
    return [torch.randn(8192, 4096, device=device)]
