"""Stable-Diffusion-style step (fp16): UNet ResNet blocks (GroupNorm + SiLU), cross-attention
transformers with GEGLU, and a VAE decoder stage (GroupNorm, single-head softmax attention).

UNet part at (2, 320, 64, 64) with a 77x768 text context; VAE part at (1, 512, 128, 128).
"""

import torch

from forge_tui.examples._diffusion_parts import DiffusionConfig, DiffusionStep, diffusion_inputs, init_random

DTYPE = torch.float16
CONFIG = DiffusionConfig()


def get_model(device="cpu"):
    with torch.device(device):  # built where it runs: random init of large weights is fast there
        return init_random(DiffusionStep(CONFIG))


def get_inputs(device="cpu"):
    with torch.device(device):
        return diffusion_inputs(CONFIG)
