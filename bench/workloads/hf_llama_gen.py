"""Generation workload: Hugging Face's Llama (``LlamaForCausalLM``) at Llama-3.2-1B's shapes, built
from its configuration with random weights (nothing is downloaded), bf16, SDPA attention. On CUDA:
16 layers, hidden 2048, 32 heads of 64, 8 KV heads, MLP 8192, vocabulary 128256 with the embedding
tied to the LM head (about 1.24 billion parameters, 2.5 GB), prompts of 128 tokens; on the CPU a
tiny one (its weights spread wider, so that its tokens vary). The forward (``get_model``/``get_inputs``, what ``forge profile`` runs) is a prefill of
8 prompts; ``generate`` is the model's own greedy ``generate()``. No EOS token: every generation
makes exactly the tokens asked for. Needs ``transformers``.

    forge bench bench/workloads/hf_llama_gen.py -w WS --generate 64
    python bench/generate_bench.py bench/workloads/hf_llama_gen.py
"""

import torch

from forge_tui.examples._hf_parts import causal_lm

DTYPE = torch.bfloat16
PROMPT_LEN = {"cuda": 128, "cpu": 16}
NEW_TOKENS = 64
BATCHES = (1, 8)


def _config(device: str):
    from transformers import LlamaConfig

    big = device == "cuda"
    return LlamaConfig(
        vocab_size=128256 if big else 512, hidden_size=2048 if big else 64, intermediate_size=8192 if big else 128,
        num_hidden_layers=16 if big else 2, num_attention_heads=32 if big else 4, num_key_value_heads=8 if big else 2,
        head_dim=64 if big else 16, rope_theta=500000.0, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa",
        # the tiny model's weights spread wider than Llama's 0.02, so that its greedy tokens vary from
        # step to step (at 0.02 it repeats one token, which a wrong position or mask would repeat too)
        initializer_range=0.02 if big else 0.2)


def get_model(device="cpu"):
    from transformers import LlamaForCausalLM

    return causal_lm(LlamaForCausalLM, _config(device), device)


def get_inputs(device="cpu"):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, _config(device).vocab_size, (8 if device == "cuda" else 2, PROMPT_LEN[device]),
                          generator=g).to(device)]


def generate(model, inputs, max_new_tokens=NEW_TOKENS):
    """The model's own greedy generation: ``generate()`` with its default (dynamic) cache."""
    from forge_tui.generation import eager_generate

    return eager_generate(model, inputs[0], max_new_tokens)
