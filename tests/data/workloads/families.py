"""One forward that exercises every template family (CPU-sized, fp32)."""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.variance_epsilon = 1e-6

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(v + self.variance_epsilon)
        return self.weight * h.to(dt)


class SiluMul(nn.Module):
    def forward(self, a, b):
        return F.silu(a) * b


class GeluMul(nn.Module):
    def forward(self, a, b):
        return a * F.gelu(b)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rms = RMSNorm(256)
        self.ln = nn.LayerNorm(256)
        self.ln_plain = nn.LayerNorm(256, elementwise_affine=False)
        self.gn = nn.GroupNorm(8, 32)
        self.bn = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(3, 2, 1)  # returns the values only: a module card without indices
        self.gate = SiluMul()
        self.geglu = GeluMul()
        self.bias = nn.Parameter(torch.randn(256))
        with torch.no_grad():
            self.bn.running_mean.copy_(0.1 * torch.randn(32))
            self.bn.running_var.copy_(0.5 + torch.rand(32))
            self.gn.weight.copy_(1 + 0.1 * torch.randn(32))
            self.gn.bias.copy_(0.1 * torch.randn(32))

    def forward(self, x, y, img):
        outs = [
            torch.softmax(x, -1), torch.log_softmax(y * 3.0, -1), self.rms(x), self.ln(y), self.ln_plain(x),
            F.gelu(x), F.gelu(y, approximate="tanh"), self.gate(x, y), self.geglu(y, x), x + self.bias,
            self.gn(img), self.bn(img), F.adaptive_avg_pool2d(img, 1), F.max_pool2d(img, 3, 2, 1),
            self.pool(img * 2.0),
            torch.softmax(x.view(8, 8, 256)[:, -3:, :], -1),  # rows of the last positions: strided rows
        ]
        return outs


def get_model():
    return Model().eval()


def get_inputs():
    return [torch.randn(64, 256), torch.randn(64, 256), torch.randn(2, 32, 16, 16)]
