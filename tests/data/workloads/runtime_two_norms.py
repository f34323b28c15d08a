"""The runtime model with two RMSNorm leaf modules (one module card, two sites) called in the top
module's own forward beside its softmax (an op card): a compiled scope with two graph breaks."""
import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location("runtime_model", Path(__file__).with_name("runtime_model.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
sys.modules.setdefault("runtime_model", _base)  # importable by name, as Dynamo's recompiles need
RMSNorm = _base.RMSNorm


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = RMSNorm(256)
        self.norm2 = RMSNorm(256)

    def forward(self, x):
        return torch.softmax(self.norm2(self.norm1(x) * 0.5), dim=-1)


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs(device="cpu"):
    return [torch.randn(16, 256, device=device)]
