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
    DenseMLPSpec,
    GatedMLPSpec,
    MoESpec,
    NormSpec,
)

NORMS = {"pre_norm": 2, "sandwich": 4, "parallel": 1, "post_norm": 2}
KIND = {"gemma3": "sandwich", "gptj": "parallel", "opt-postnorm-project": "post_norm"}
QK_NORM = ("gemma3", "qwen3-sliding", "qwen3-moe", "llama4")
# where not every layer has rope (OPT: learned positions)
ROPE_LAYERS = {"llama4": {0, 2}, "smollm3-nope": {0, 2}, "opt-prenorm": (),
               "opt-postnorm-project": ()}  # fmt: skip
MLP = {"gpt-oss": MoESpec, "gptj": DenseMLPSpec, "opt-prenorm": DenseMLPSpec,
       "opt-postnorm-project": DenseMLPSpec, "qwen3-moe": MoESpec, "llama4": MoESpec}  # fmt: skip
DENSE_LAYERS = {"qwen3-moe": {1}, "llama4": {0, 3}}  # the dense layers of an MoE family


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
        assert attn.layer == i and attn.num_heads == cfg.num_attention_heads
        assert attn.num_heads % attn.num_kv_heads == 0
        assert attn.qkv.fn is block.attn.qkv.fn and attn.o_proj.weight is block.attn.o_proj.weight
        assert attn.window == block.attn.window and attn.scale == block.attn.scale
        assert (attn.rope is None) == (block.attn.rotary is None)
        rope = i in ROPE_LAYERS.get(variant, range(len(model.layers)))
        assert (attn.rope is not None) == rope
        l2_norms = variant == "llama4" and rope  # Llama 4: weightless QK-norms after rope
        qk_norms = variant in QK_NORM and (rope or variant != "llama4")
        assert (attn.q_norm is not None) == qk_norms
        assert attn.norms_after_rope == l2_norms
        assert (attn.temperature is not None) == (variant == "llama4" and not rope)
        assert (attn.sinks is None) == (variant != "gpt-oss")
        dense = i in DENSE_LAYERS.get(variant, ())
        assert isinstance(spec.mlp, GatedMLPSpec if dense else MLP.get(variant, GatedMLPSpec))
        if isinstance(spec.mlp, GatedMLPSpec | DenseMLPSpec):
            assert spec.mlp.activation in ACTIVATIONS
        if isinstance(spec.mlp, MoESpec):  # Llama 4: a shared expert, inputs weighed
            assert (spec.mlp.shared is not None) == spec.mlp.scale_input == (variant == "llama4")
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.kind = "pre_norm"  # type: ignore[misc]
