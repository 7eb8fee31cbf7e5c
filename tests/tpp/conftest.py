"""Fixtures of the pace-tpp tests: skip everything unless the plugin and its glue work here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers as tf

from pace_core import plugins


@pytest.fixture(scope="session", autouse=True)
def tpp_glue():
    """The built glue module (built on first use), or skip with the reason."""
    if importlib.util.find_spec("pace_tpp") is None:
        pytest.skip("pace-tpp is not installed (pip install -e plugins/tpp)")
    from pace_tpp import build

    reason = build.unavailable_reason()
    if reason:
        pytest.skip(f"pace-tpp unavailable: {reason}")
    return build.load()


@pytest.fixture(autouse=True)
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    """No PACE_* selection variables leak in; each test sees a freshly loaded plugin host."""
    for name in ("PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
                 "PACE_OPCONFIG", "PACE_TPP_BN", "PACE_TPP_BK", "PACE_TPP_BM"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    plugins.reset_host()
    yield
    plugins.reset_host()


def save_tiny_llama(tmp_dir: Path, hidden: int = 96, intermediate: int = 200) -> Path:
    """A random 2-layer Llama whose dims are not multiples of the default 64 blocks."""
    cfg = tf.LlamaConfig(
        vocab_size=150, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # larger weights than HF's init: clear greedy margins
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(noise * 0.15 if p.dim() > 1 else 1 + noise * 0.1)
    model.save_pretrained(tmp_dir, safe_serialization=True)
    return tmp_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tpp-llama"))
