"""Shared by the workloads built from Hugging Face ``transformers`` classes (bench/workloads/hf_*.py):
the model with a plain-tensor forward, and token inputs. ``transformers`` itself is imported by the
workloads, only when they build a model."""

import torch


class Logits(torch.nn.Module):
    """The HF causal LM with a plain-tensor forward: input ids in, logits out (no KV cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def causal_lm(model_cls: type, config, device: str) -> Logits:
    """``model_cls(config)`` with seeded random weights, built on ``device``, in eval mode, as Logits."""
    torch.manual_seed(0)
    with torch.device(device):
        return Logits(model_cls(config)).eval()


def token_inputs(vocab: int, device: str) -> list[torch.Tensor]:
    """4 sequences of 1024 random token ids on CUDA, 2 of 16 elsewhere (seeded)."""
    batch, seq = (4, 1024) if device == "cuda" else (2, 16)
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, seq), generator=g).to(device)]
