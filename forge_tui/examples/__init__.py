"""Bundled example workloads.

Each module here is an ordinary workload file (``get_model()`` + ``get_inputs()``, or the
KernelBench ``Model``/``get_inputs``/``get_init_inputs``). Weights are random and built locally;
nothing is downloaded. The ``tiny_*`` ones are CPU-sized for tests and first runs; the others
are GPU-sized and mirror the model families of the Kernel Forge paper.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent

# name -> one-line description; the name is also the file stem.
EXAMPLES: dict[str, str] = {
    "tiny_mlp": "CPU-sized MLP with LayerNorm, GELU and softmax (fp32)",
    "tiny_decoder": "CPU-sized decoder-only transformer: HF-style RMSNorm, RoPE, gated SiLU MLP (fp32)",
    "tiny_diffusion": "CPU-sized SD-style block: GroupNorm+SiLU ResNet block and attention (fp32)",
    "tiny_moe": "CPU-sized mixture-of-experts decoder, 8 experts top-2 (fp32)",
    "tiny_resnet": "CPU-sized ResNet (bottlenecks, BatchNorm, max/avg pooling) (fp32)",
    "kb_softmax": "a KernelBench-format problem (Model, get_inputs, get_init_inputs): softmax",
    "resnet50": "ResNet-50, batch 32, 224x224, fp16 (torchvision when installed)",
    "decoder": "Gemma-3-like decoder, 8 layers, hidden 1536, vocab 262144, bf16, 4x1024 tokens",
    "diffusion": "SD-style UNet block (ResNet + cross-attention transformer) and VAE block, fp16",
    "moe": "Qwen-3-MoE-like decoder, 6 layers, 64 experts top-8, bf16, 4x1024 tokens",
}


def example_path(name: str) -> Path:
    return EXAMPLES_DIR / f"{name}.py"
