"""CPU-sized mixture-of-experts decoder: 8 experts top-2, SDPA attention, q/k norm, fp32."""

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

CONFIG = DecoderConfig(
    layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=0, vocab=256,
    act="silu", attention="sdpa", qk_norm=True, experts=8, top_k=2, expert_intermediate=32,
    sample_positions=4, embed_scale=False,
)
PROMPT_LEN = 16  # generation (``generate``, ``forge bench --generate``): prompt length, new tokens, batches
NEW_TOKENS = 8
BATCHES = (1, 2)


def get_model():
    return init_random(Decoder(CONFIG))


def get_inputs():
    return decoder_inputs(CONFIG, 2, 16)


def generate(model, inputs, max_new_tokens=NEW_TOKENS):
    """The example's own greedy generation: a plain loop over a cache that grows at every step."""
    from forge_tui.generation import eager_generate

    return eager_generate(model, inputs[0], max_new_tokens)
