"""Rotary.tables: position-indexed lookup tables give the values of computing the positions'
own tables, and grow only as far as the positions ask (doubling, capped at the context)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from pace_core.models.rope import Rotary

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
CONFIGS = {
    "default": tf.LlamaConfig(max_position_embeddings=1024, **SMALL),
    "linear": tf.LlamaConfig(
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        **SMALL,
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_lookup_equals_computed(kind, dtype):
    rot = Rotary(CONFIGS[kind], 16)
    gen = torch.Generator().manual_seed(0)
    for high in (40, 300, 700):  # grows past the first 256 positions, then again
        positions = torch.randint(0, high, (3, 5), generator=gen)
        got = rot.tables(positions, dtype)
        want = rot._compute(positions, rot.inv_freq, dtype)
        assert got[0].shape == (3, 5, rot.rotary_dim)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    decode = torch.tensor([[5], [699]])
    got = rot.tables(decode, dtype, below=700)
    want = rot._compute(decode, rot.inv_freq, dtype)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_tables_grow_by_doubling_up_to_the_context():
    rot = Rotary(CONFIGS["default"], 16)
    size = lambda: rot._lookup[torch.float32][0].shape[0]  # noqa: E731
    rot.tables(torch.tensor([[3]]), torch.float32, below=4)
    assert size() == 256
    rot.tables(torch.tensor([[300]]), torch.float32, below=301)
    assert size() == 512
    rot.tables(torch.tensor([[600]]), torch.float32, below=601)
    assert size() == 1024  # min(2 x 512, the context of 1024)
    rot.tables(torch.tensor([[1500]]), torch.float32, below=1501)
    assert size() == 1501  # past the context: exactly as far as asked
