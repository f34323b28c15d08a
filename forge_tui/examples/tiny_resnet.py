"""CPU-sized ResNet: bottleneck blocks (1 per stage), width 8, batch 2, 32x32 images, fp32."""

import torch

from forge_tui.examples._resnet_parts import ResNet, randomize_batchnorm


def get_model():
    return randomize_batchnorm(ResNet((1, 1, 1, 1), width=8, num_classes=10))


def get_inputs():
    return [torch.randn(2, 3, 32, 32)]
