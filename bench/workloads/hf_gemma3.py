"""Bench workload: a model the team did not write, Hugging Face's Gemma-3 text decoder
(``transformers.Gemma3ForCausalLM``) built from its configuration with random weights (nothing is
downloaded), bf16, eager attention; the forward returns the logits. On CUDA: 4 layers at Gemma-3
1B's widths (hidden 1152, 4 heads of 256, 1 kv head, MLP 6912), 4 sequences of 1024 tokens, a
32768-token vocabulary; on the CPU a tiny one. Needs ``transformers``.

    python bench/e2e_bench.py bench/workloads/hf_gemma3.py
"""

import torch

from forge_tui.examples._hf_parts import causal_lm, token_inputs

DTYPE = torch.bfloat16


def _config(device: str):
    from transformers import Gemma3TextConfig

    big = device == "cuda"
    return Gemma3TextConfig(
        vocab_size=32768 if big else 512, hidden_size=1152 if big else 64, intermediate_size=6912 if big else 128,
        num_hidden_layers=4 if big else 2, num_attention_heads=4, num_key_value_heads=1, head_dim=256 if big else 16,
        max_position_embeddings=2048, sliding_window=512 if big else 8, attn_implementation="eager")


def get_model(device="cpu"):
    from transformers import Gemma3ForCausalLM

    return causal_lm(Gemma3ForCausalLM, _config(device), device)


def get_inputs(device="cpu"):
    return token_inputs(_config(device).vocab_size, device)
