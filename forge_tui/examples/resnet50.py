"""ResNet-50 (fp16, batch 32, 224x224): torchvision's model when torchvision is installed,
else the module-for-module copy bundled with forge-tui. Random weights."""

import torch

from forge_tui.examples._resnet_parts import ResNet, randomize_batchnorm

DTYPE = torch.float16


def get_model(device="cpu"):
    try:
        from torchvision.models import resnet50
        model = resnet50(weights=None)
    except Exception:  # torchvision missing or not importable beside this torch build
        model = ResNet((3, 4, 6, 3))
    return randomize_batchnorm(model).to(device)


def get_inputs(device="cpu"):
    return [torch.randn(32, 3, 224, 224, device=device)]
