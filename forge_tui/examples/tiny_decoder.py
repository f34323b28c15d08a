"""CPU-sized decoder: the same code as the bundled Gemma-like decoder, gated SiLU MLP, fp32."""

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

CONFIG = DecoderConfig(
    layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256,
    act="silu", sample_positions=4,
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
