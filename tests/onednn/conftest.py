"""Fixtures of the pace-onednn tests: skip unless the plugin and its glue work here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers as tf

from pace_core import plugins


@pytest.fixture(scope="session", autouse=True)
def onednn_glue():
    """The built glue module (built on first use), or skip with the reason."""
    if importlib.util.find_spec("pace_onednn") is None:
        pytest.skip("pace-onednn is not installed (pip install -e plugins/onednn)")
    from pace_onednn import build

    reason = build.unavailable()
    if reason:
        pytest.skip(f"pace-onednn unavailable: {reason}")
    return build.extension()


@pytest.fixture(autouse=True)
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    """No PACE_* selection variables leak in; each test sees a freshly loaded plugin host."""
    for name in ("PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
                 "PACE_OPCONFIG", "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    plugins.reset_host()
    yield
    plugins.reset_host()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama (hidden 96, intermediate 200: not multiples of 16 or 64)."""
    cfg = tf.LlamaConfig(
        vocab_size=150, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
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
    out = tmp_path_factory.mktemp("onednn-llama")
    model.save_pretrained(out, safe_serialization=True)
    return out
