"""Every block of every tiny family describes itself (``pace_core.stack_spec``): the contract a
backend fusing ``decoder_stack`` reads instead of the core's block classes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.tiny import FACTORIES

from pace_core import LLMModel
from pace_core.ops import ACTIVATIONS
from pace_core.stack_spec import (
    BLOCK_KINDS,
    AttentionSpec,
    DenseMLPSpec,
    GatedMLPSpec,
    LatentAttentionSpec,
    MoESpec,
    NormSpec,
)

NORMS = {"pre_norm": 2, "sandwich": 4, "parallel": 1, "post_norm": 2, "opaque": 0}
KIND = {"gemma3": "sandwich", "gptj": "parallel", "opt-postnorm-project": "post_norm",
        "gemma4": "opaque", "gemma4-dense": "opaque"}  # fmt: skip
QK_NORM = ("gemma3", "qwen3-sliding", "qwen3-moe", "llama4")
# where not every layer has rope (OPT: learned positions)
ROPE_LAYERS = {"llama4": {0, 2}, "smollm3-nope": {0, 2}, "opt-prenorm": (),
               "opt-postnorm-project": ()}  # fmt: skip
MLP = {"gpt-oss": MoESpec, "gptj": DenseMLPSpec, "opt-prenorm": DenseMLPSpec,
       "opt-postnorm-project": DenseMLPSpec, "qwen3-moe": MoESpec, "llama4": MoESpec}  # fmt: skip
DEEPSEEK = ("deepseek-v3", "deepseek-v3-q-proj")
MLP.update(dict.fromkeys(DEEPSEEK, MoESpec))
# the dense layers of an MoE family
DENSE_LAYERS = {"qwen3-moe": {1}, "llama4": {0, 3}, **dict.fromkeys(DEEPSEEK, frozenset({0}))}


@pytest.mark.parametrize("variant", sorted(FACTORIES))
def test_every_block_describes_itself(variant, tmp_path):
    path = FACTORIES[variant](tmp_path)
    model = LLMModel(path, dtype=torch.float32, opconfig={"default": "native"},
                     load_tokenizer=False).model  # fmt: skip
    cfg = model.config
    for i, block in enumerate(model.layers):
        spec = block.describe()
        assert spec.kind == block.kind == KIND.get(variant, "pre_norm")
        assert spec.kind in BLOCK_KINDS and len(spec.norms) == NORMS[spec.kind]
        for norm in spec.norms:
            assert isinstance(norm, NormSpec) and norm.op in ("rms_norm", "layer_norm")
        attn = spec.attention
        if spec.kind == "opaque":  # only the block's own code runs it
            assert attn is None and isinstance(spec.mlp, GatedMLPSpec)
            continue
        assert attn.layer == i and attn.num_heads == cfg.num_attention_heads
        if variant.startswith("deepseek"):
            _check_latent(attn, block.attn, cfg)
        else:
            _check_attention(attn, block.attn, variant, i in ROPE_LAYERS.get(variant, (i,)))
        dense = i in DENSE_LAYERS.get(variant, ())
        assert isinstance(spec.mlp, GatedMLPSpec if dense else MLP.get(variant, GatedMLPSpec))
        if isinstance(spec.mlp, GatedMLPSpec | DenseMLPSpec):
            assert spec.mlp.activation in ACTIVATIONS
        if isinstance(spec.mlp, MoESpec):  # Llama 4: inputs weighed; Llama 4, DeepSeek: shared
            assert spec.mlp.scale_input == (variant == "llama4")
            assert (spec.mlp.shared is not None) == (variant in ("llama4", *DEEPSEEK))
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.kind = "pre_norm"  # type: ignore[misc]


def _check_attention(attn, block_attn, variant: str, rope: bool) -> None:
    assert isinstance(attn, AttentionSpec) and attn.num_heads % attn.num_kv_heads == 0
    assert attn.qkv.fn is block_attn.qkv.fn and attn.o_proj.weight is block_attn.o_proj.weight
    assert attn.window == block_attn.window and attn.scale == block_attn.scale
    assert (attn.rope is None) == (block_attn.rotary is None)
    assert (attn.rope is not None) == rope
    l2_norms = variant == "llama4" and rope  # Llama 4: weightless QK-norms after rope
    qk_norms = variant in QK_NORM and (rope or variant != "llama4")
    assert (attn.q_norm is not None) == qk_norms
    assert attn.norms_after_rope == l2_norms
    assert (attn.temperature is not None) == (variant == "llama4" and not rope)
    assert (attn.sinks is None) == (variant != "gpt-oss")


def _check_latent(attn, block_attn, cfg) -> None:
    """MLA: the per-head absorption maps split kv_b_proj; rope on the decoupled dims."""
    assert isinstance(attn, LatentAttentionSpec)
    heads, rank = cfg.num_attention_heads, cfg.kv_lora_rank
    assert attn.w_uk.shape == (heads, cfg.qk_nope_head_dim, rank)
    assert attn.w_uv.shape == (heads, cfg.v_head_dim, rank) and attn.v_dim == cfg.v_head_dim
    assert (attn.rank, attn.rope_dim) == (rank, cfg.qk_rope_head_dim)
    assert attn.rope.rotary.rotary_dim == cfg.qk_rope_head_dim and attn.rope.interleaved
    assert attn.kv_norm.weight.shape == (rank,) and attn.kv_a.weight is block_attn.kv_a.weight
    assert attn.scale == block_attn.scale
