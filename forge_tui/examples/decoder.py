"""Gemma-3-like decoder (bf16): HF-style RMSNorm, RoPE, gated GELU(tanh) MLP, eager softmax attention.

8 layers, hidden 1536, vocab 262144, 4 sequences of 1024 tokens; random weights.
"""

import torch

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

DTYPE = torch.bfloat16
CONFIG = DecoderConfig()
BATCH, SEQ = 4, 1024
PROMPT_LEN = 128  # generation (``generate``, ``forge bench --generate``): prompt length, new tokens, batches
NEW_TOKENS = 64
BATCHES = (1, 8)


def get_model(device="cpu"):
    with torch.device(device):  # built where it runs: random init of large weights is fast there
        return init_random(Decoder(CONFIG))


def get_inputs(device="cpu"):
    with torch.device(device):
        return decoder_inputs(CONFIG, BATCH, SEQ)


def generate(model, inputs, max_new_tokens=NEW_TOKENS):
    """The example's own greedy generation: a plain loop over a cache that grows at every step."""
    from forge_tui.generation import eager_generate

    return eager_generate(model, inputs[0], max_new_tokens)
