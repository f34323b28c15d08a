"""Answers: how much faster does ResNet-50 fp16 (batch 32) run in eager on the H200 when every
batch norm is folded into the convolution before it, and when the ReLUs (and the residual add)
are fused into that convolution too by cuDNN (aten.cudnn_convolution_relu / _add_relu)? Next to
torch.compile and CUDA graphs of the same models, timed interleaved in one process.

    python bench/lab/resnet_fold_probe.py [--reps 40]

Prints a table (median ms, q1-q3, ratio to eager with paired spread) and the outputs' largest
difference from eager's; JSON to $OUT if set.

Answer on the H200 (2026-12-02, torch 2.11, 40 reps; docs/runs/data/2026-12-02-s11/call1-*): eager
5.99 ms; folded 3.97 ms, 1.511x [1.480, 1.523]; folded with cuDNN's fused ReLU 4.35 ms, 1.366x (its
fused kernels are slower); torch.compile 1.708x; CUDA graphs of eager 1.626x, of folded+ReLU 1.825x.
Outputs within 7.4e-4 of eager's largest value (torch.compile: 6.6e-4). So folding alone is the lever.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from forge_tui.examples import resnet50  # noqa: E402


def _pairs(model: nn.Module):
    """(parent, conv name, bn name) of every convolution followed by its batch norm."""
    for m in model.modules():
        for c, b in (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")):
            if isinstance(getattr(m, c, None), nn.Conv2d) and isinstance(getattr(m, b, None), nn.BatchNorm2d):
                yield m, c, b
        if isinstance(m, nn.Sequential) and len(m) == 2 and isinstance(m[0], nn.Conv2d) and isinstance(m[1], nn.BatchNorm2d):
            yield m, "0", "1"


def folded(model: nn.Module) -> nn.Module:
    m = copy.deepcopy(model)
    for parent, c, b in list(_pairs(m)):
        conv, bn = parent._modules[c], parent._modules[b]
        parent._modules[c] = fuse_conv_bn_eval(conv.float(), bn.float()).half()
        parent._modules[b] = nn.Identity()
    return m


def _conv_relu(conv: nn.Conv2d, x, z=None):
    a = (x, conv.weight)
    k = (conv.stride, conv.padding, conv.dilation, conv.groups)
    if z is None:
        return torch.ops.aten.cudnn_convolution_relu(*a, conv.bias, *k)
    return torch.ops.aten.cudnn_convolution_add_relu(*a, z, 1.0, conv.bias, *k)


def _block_forward(self, x):
    identity = self.downsample(x) if self.downsample is not None else x
    out = _conv_relu(self.conv1, x)
    out = _conv_relu(self.conv2, out)
    return _conv_relu(self.conv3, out, identity)


def _stem_forward(self, x):
    x = self.maxpool(_conv_relu(self.conv1, x))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(torch.flatten(self.avgpool(x), 1))


def fused_relu(model: nn.Module) -> nn.Module:
    m = folded(model)
    for mod in m.modules():
        if hasattr(mod, "conv3") and hasattr(mod, "downsample"):
            mod.forward = types.MethodType(_block_forward, mod)
    m.forward = types.MethodType(_stem_forward, m)
    return m


def graphed(fn, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(x)

    def run():
        g.replay()
        return out
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    base = resnet50.get_model("cuda").half().eval()
    x = resnet50.get_inputs("cuda")[0].half()
    fold, fuse = folded(base), fused_relu(base)
    variants: dict = {}
    with torch.inference_mode():
        variants["eager"] = lambda: base(x)
        variants["folded"] = lambda: fold(x)
        variants["folded+relu"] = lambda: fuse(x)
        t0 = time.perf_counter()
        comp = torch.compile(base)
        comp(x)
        comp(x)
        print(f"compile {time.perf_counter() - t0:.1f} s", flush=True)
        variants["compile"] = lambda: comp(x)
        variants["graphs eager"] = graphed(base, x)
        variants["graphs folded+relu"] = graphed(fuse, x)
        ref = base(x).float()
        diffs = {}
        for k, f in variants.items():
            out = f().float()
            diffs[k] = float((out - ref).abs().max() / ref.abs().max())
        times: dict = {k: [] for k in variants}
        for _ in range(5):
            for f in variants.values():
                f()
        torch.cuda.synchronize()
        for _ in range(args.reps):
            for k, f in variants.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                f()
                torch.cuda.synchronize()
                times[k].append((time.perf_counter() - t) * 1e3)
    rows = []
    print(f"{'variant':22} {'median ms':>10} {'q1-q3':>15} {'x eager':>8} {'paired q1-q3':>15} {'max rel diff':>12}")
    for k, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        r = [e / t for e, t in zip(times["eager"], ts)]
        rq = statistics.quantiles(r, n=4)
        rows.append({"variant": k, "median_ms": statistics.median(ts), "q1": q[0], "q3": q[2],
                     "x_eager": statistics.median(r), "x_q1": rq[0], "x_q3": rq[2], "max_rel_diff": diffs[k]})
        print(f"{k:22} {statistics.median(ts):10.3f} {q[0]:7.3f}-{q[2]:7.3f} {statistics.median(r):8.3f} "
              f"{rq[0]:7.3f}-{rq[2]:7.3f} {diffs[k]:12.2e}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "resnet_fold_probe.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
