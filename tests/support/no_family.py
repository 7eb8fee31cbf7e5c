"""Tiny random transformers models of architectures pace has no family for (the torch.compile
backend's and the transformers fallback's tests), and a fresh-Dynamo fixture."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=300,
    max_position_embeddings=256,
    eos_token_id=None,  # greedy runs produce all their tokens
    pad_token_id=None,
    bos_token_id=None,
)


def no_family_model(arch: str, dtype: torch.dtype = torch.float32, **extra: Any):
    """A tiny ``arch`` model, seed 0, with 1-D parameters moved off their defaults (so a
    dropped norm scale or bias cannot pass)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(arch, **{**SHAPE, **extra})
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture
def fresh_dynamo():
    """Compile from scratch (Dynamo's caches are per code object, shared by every instance of
    a transformers class) and leave nothing compiled behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
