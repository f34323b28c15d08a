"""A row softmax large enough (1024x512 fp32, 2 MiB out) that timed calls are spot-checked."""
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_model():
    return Model()


def get_inputs(device="cpu"):
    return [torch.randn(1024, 512, device=device)]
