"""Helpers of the speculative tests: tiny random Llama checkpoints and prompts."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 128
MAX_POS = 256


def save_llama(
    path: Path,
    *,
    vocab: int = VOCAB,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    noise: float = 0.5,
    **extra,
) -> Path:
    """A random Llama checkpoint; ``noise`` widens logit margins (stable greedy argmax)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    model.save_pretrained(path)
    return path


def prompts(sizes=(5, 9, 3, 12, 7, 4, 10, 6), seed: int = 0) -> list[torch.Tensor]:
    """Random prompts of mixed lengths over the tiny vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in sizes]
