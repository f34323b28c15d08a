"""Two row softmaxes of different shapes (two op cards, each served by tests/candidates/cpu/softmax_good.cpp)."""
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.softmax(x, dim=-1), torch.softmax(y, dim=-1)


def get_model():
    return Model()


def get_inputs(device="cpu"):
    torch.manual_seed(0)
    return [torch.randn(16, 64, device=device), torch.randn(8, 200, device=device)]
