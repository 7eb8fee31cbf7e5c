"""Gemma 3 (text): QK-norm, (1 + w) RMSNorms around attention and MLP, GeGLU, local/global
layers with their own rope, ``query_pre_attn_scalar`` scale and scaled embeddings.

``build_conditional`` loads the text part of a ``Gemma3ForConditionalGeneration`` checkpoint.
"""

from __future__ import annotations

from pace_core.errors import ModelLoadError
from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import SandwichBlock


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    if getattr(cfg, "attn_logit_softcapping", None):
        raise ModelLoadError("Gemma attn_logit_softcapping is not supported by pace's attention op")
    _, _, hd = common.heads(cfg)
    eps = cfg.rms_norm_eps

    def norm(name: str):
        return b.norm(name, eps, offset=1.0)

    rotaries = common.rotaries_by_type(cfg, hd)
    embed = common.embedding(b, "model.embed_tokens.weight")
    head = common.lm_head(b, cfg, embed)  # next to the table it may share: one copy at a time
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        layer_type = cfg.layer_types[i] if None not in rotaries else None
        attn = common.self_attention(
            b,
            i,
            f"{p}.self_attn",
            rotary=rotaries[layer_type],
            bias=cfg.attention_bias,
            o_bias=cfg.attention_bias,
            scale=cfg.query_pre_attn_scalar**-0.5,
            q_norm=norm(f"{p}.self_attn.q_norm"),
            k_norm=norm(f"{p}.self_attn.k_norm"),
        )
        mlp = common.gated_mlp(b, f"{p}.mlp", cfg.hidden_activation)
        layers.append(
            SandwichBlock(
                norm(f"{p}.input_layernorm"),
                attn,
                norm(f"{p}.post_attention_layernorm"),
                norm(f"{p}.pre_feedforward_layernorm"),
                mlp,
                norm(f"{p}.post_feedforward_layernorm"),
            )
        )
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=norm("model.norm"),
        head=head,
        rotaries=list(rotaries.values()),
        embed_scale=cfg.hidden_size**0.5,
        logit_softcap=getattr(cfg, "final_logit_softcapping", None),
    )


def build_conditional(b: ModelBuilder) -> DecoderLM:
    return common.build_text_part(b, build)


build_conditional.harmless_extras = (
    r"(model\.)?vision_tower\..*",
    r"(model\.)?multi_modal_projector\..*",
)
