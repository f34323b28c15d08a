"""Qwen-3-MoE-like decoder (bf16): 6 layers, 64 experts top-8, q/k RMSNorm, SDPA attention.

Routing and expert dispatch as Hugging Face's eager code does it; 4 sequences of 1024 tokens.
"""

import torch

from forge_tui.examples._decoder_parts import Decoder, DecoderConfig, decoder_inputs, init_random

DTYPE = torch.bfloat16
CONFIG = DecoderConfig(
    layers=6, hidden=2048, heads=32, kv_heads=4, head_dim=128, intermediate=0, vocab=151936,
    act="silu", attention="sdpa", qk_norm=True, experts=64, top_k=8, expert_intermediate=768,
    embed_scale=False,
)
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
