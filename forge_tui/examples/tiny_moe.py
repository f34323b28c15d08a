"""CPU-sized mixture-of-experts decoder: 8 experts top-2, SDPA attention, q/k norm, fp32."""

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

CONFIG = DecoderConfig(
    layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=0, vocab=256,
    act="silu", attention="sdpa", qk_norm=True, experts=8, top_k=2, expert_intermediate=32,
    sample_positions=4, embed_scale=False,
)


def get_model():
    return init_random(Decoder(CONFIG))


def get_inputs():
    return decoder_inputs(CONFIG, 2, 16)
