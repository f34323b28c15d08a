"""Bench workload: a model the team did not write, Hugging Face's Llama (``LlamaForCausalLM``,
the code Llama 3, Qwen-style and many fine-tunes share) built from its configuration with random
weights (nothing is downloaded), bf16, SDPA attention; the forward returns the logits. On CUDA: 4
layers at Llama 3.2 1B's widths (hidden 2048, 32 heads of 64, 8 kv heads, MLP 8192), 4 sequences of
1024 tokens, a 32768-token vocabulary; on the CPU a tiny one. Needs ``transformers``.

    python bench/e2e_bench.py bench/workloads/hf_llama.py
"""

import torch

from forge_tui.examples._hf_parts import causal_lm, token_inputs

DTYPE = torch.bfloat16


def _config(device: str):
    from transformers import LlamaConfig

    big = device == "cuda"
    return LlamaConfig(
        vocab_size=32768 if big else 512, hidden_size=2048 if big else 64, intermediate_size=8192 if big else 128,
        num_hidden_layers=4 if big else 2, num_attention_heads=32 if big else 4, num_key_value_heads=8 if big else 2,
        max_position_embeddings=2048, attn_implementation="sdpa")


def get_model(device="cpu"):
    from transformers import LlamaForCausalLM

    return causal_lm(LlamaForCausalLM, _config(device), device)


def get_inputs(device="cpu"):
    return token_inputs(_config(device).vocab_size, device)
