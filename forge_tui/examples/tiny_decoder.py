"""CPU-sized decoder: the same code as the bundled Gemma-like decoder, gated SiLU MLP, fp32."""

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

CONFIG = DecoderConfig(
    layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256,
    act="silu", sample_positions=4,
)


def get_model():
    return init_random(Decoder(CONFIG))


def get_inputs():
    return decoder_inputs(CONFIG, 2, 16)
