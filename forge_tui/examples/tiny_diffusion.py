"""CPU-sized SD-style step: the bundled diffusion example's code at 32 channels, 8x8, fp32."""

from forge_tui.examples._diffusion_parts import DiffusionConfig, DiffusionStep, diffusion_inputs, init_random

CONFIG = DiffusionConfig(
    channels=32, size=8, batch=2, temb=64, context_len=6, context_dim=48, heads=4, groups=8,
    vae_channels=32, vae_size=8, vae_batch=1,
)


def get_model():
    return init_random(DiffusionStep(CONFIG))


def get_inputs():
    return diffusion_inputs(CONFIG)
