"""OPT: learned positions (offset 2), biased MHA, ReLU ``fc1/fc2`` MLP, LayerNorm; pre-norm, or
post-norm when ``do_layer_norm_before`` is False (opt-350m, which also projects embeddings
``word_embed_proj_dim <-> hidden_size`` with ``project_in/out``); tied lm_head."""

from __future__ import annotations

import torch

from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import Bound, Norm, PostNormBlock, PreNormBlock

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding reserves the first two rows
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default; OPT has no eps in its config


class LearnedPositions:
    """Position embeddings: row ``position + 2`` of ``embed_positions``.

    HF derives positions from the attention mask (``cumsum(mask) - 1``), which equals the
    engine's positions on every real token; pads differ (HF -1, engine 0) but are never attended.
    """

    __slots__ = ("embed",)

    def __init__(self, embed: Bound) -> None:
        self.embed = embed

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(positions + POSITION_OFFSET)


def _layer_norm(b: ModelBuilder, name: str) -> Norm:
    if getattr(b.config, "layer_norm_elementwise_affine", True):
        return b.norm(name, LAYER_NORM_EPS, rms=False, bias=True)
    ones = torch.ones(b.config.hidden_size)
    zeros = torch.zeros(b.config.hidden_size)
    return Norm(b.kernel("layer_norm").fn, ones, LAYER_NORM_EPS, zeros, is_rms=False)


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    bias = getattr(cfg, "enable_bias", True)
    # OPTForCausalLM saves ``model.decoder.*``; the original facebook/opt checkpoints ``decoder.*``.
    root = "model.decoder" if b.weights.has("model.decoder.embed_tokens.weight") else "decoder"
    embed = common.embedding(b, f"{root}.embed_tokens.weight")
    head = common.lm_head(b, cfg, embed)  # next to the table it may share: one copy at a time
    positions = LearnedPositions(
        common.embedding(b, f"{root}.embed_positions.weight", quantize=False)
    )
    projected = cfg.word_embed_proj_dim != cfg.hidden_size
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"{root}.layers.{i}"
        attn = common.self_attention(
            b, i, f"{p}.self_attn", rotary=None, bias=bias, o_proj="out_proj", o_bias=bias
        )
        mlp = common.dense_mlp(b, f"{p}.fc1", f"{p}.fc2", cfg.activation_function, bias=bias)
        attn_norm = _layer_norm(b, f"{p}.self_attn_layer_norm")
        mlp_norm = _layer_norm(b, f"{p}.final_layer_norm")
        if cfg.do_layer_norm_before:
            layers.append(PreNormBlock(attn_norm, attn, mlp_norm, mlp))
        else:
            layers.append(PostNormBlock(attn, attn_norm, mlp, mlp_norm))
    # HF builds the decoder's final LayerNorm only for pre-norm configs that keep it.
    removed = getattr(cfg, "_remove_final_layer_norm", False)
    has_final_norm = cfg.do_layer_norm_before and not removed
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=_layer_norm(b, f"{root}.final_layer_norm") if has_final_norm else None,
        head=head,
        rotaries=[],
        position_embed=positions,
        project_in=b.linear(f"{root}.project_in") if projected else None,
        project_out=b.linear(f"{root}.project_out") if projected else None,
    )
