"""pace_core.models.limits: the one reading of max positions, the serving context window and
generation_config.json."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import transformers as tf

from pace_core.errors import ConfigError
from pace_core.models import limits
from pace_core.models.rope import Rotary

LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "original_max_position_embeddings": 16,
    "short_factor": [1.0, 1.2, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
}
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)


def test_max_positions_and_default_window():
    cfg = tf.LlamaConfig(max_position_embeddings=96, **SMALL)
    assert limits.max_positions(cfg) == 96 and limits.serving_context_window(cfg) == 96
    assert limits.longrope_original_max(cfg) is None
    bare = SimpleNamespace(vocab_size=10)  # no max_position_embeddings
    assert limits.max_positions(bare) is None
    assert limits.serving_context_window(bare) == limits.DEFAULT_CONTEXT == 4096


def test_longrope_clamp_matches_the_rotary():
    cfg = tf.Phi3Config(
        max_position_embeddings=64,
        rope_parameters=LONGROPE,
        original_max_position_embeddings=16,  # Phi3Config overrides the rope's with it
        **SMALL,
    )
    rot = Rotary(cfg, 16)
    assert limits.longrope_original_max(cfg) == rot.original_max == 16
    assert limits.serving_context_window(cfg) == 16 and rot.max_positions == 64


def test_multimodal_configs_read_their_text_config():
    cfg = tf.Gemma3Config()
    assert getattr(cfg, "max_position_embeddings", None) is None
    want = cfg.text_config.max_position_embeddings
    assert limits.max_positions(cfg) == limits.serving_context_window(cfg) == want


def test_read_generation_config(tmp_path):
    assert limits.read_generation_config(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6}')
    assert limits.read_generation_config(str(tmp_path)) == {"temperature": 0.6}
    (tmp_path / "generation_config.json").write_text('{"temperature": ')
    with pytest.raises(ConfigError, match=r"generation_config\.json is not valid JSON"):
        limits.read_generation_config(tmp_path)
    (tmp_path / "generation_config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="expected an object"):
        limits.read_generation_config(tmp_path)
