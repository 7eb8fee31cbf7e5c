"""Llama 1–3.3 (and SmolLM, SmolLM2): pre-norm, GQA, gated SiLU MLP.

:func:`build` is also the skeleton of the other Llama-layout families: Qwen2 passes its bias
flags, Qwen3 its QK-norms, Mistral its window rule, SmolLM3 its NoPE layers, Phi-3 its
fused-projection readers and its window rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pace_core.caches.base import Window
from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import Bound

# (builder, attention prefix, qkv bias) -> fused Q/K/V projection
QKVReader = Callable[[ModelBuilder, str, bool], Bound]
# (builder, mlp prefix) -> MLP callable
MLPReader = Callable[[ModelBuilder, str], Callable]


def separate_qkv(b: ModelBuilder, prefix: str, bias: bool) -> Bound:
    """Q/K/V from ``{prefix}.{q,k,v}_proj``."""
    return b.qkv([f"{prefix}.{x}_proj" for x in "qkv"], bias=bias)


def separate_gated_mlp(b: ModelBuilder, prefix: str) -> Bound:
    """Gated MLP from ``{prefix}.{gate,up,down}_proj``."""
    return common.gated_mlp(b, prefix, b.config.hidden_act)


def build(
    b: ModelBuilder,
    *,
    qkv_bias: bool | None = None,
    o_bias: bool | None = None,
    qkv: QKVReader = separate_qkv,
    mlp: MLPReader = separate_gated_mlp,
    window: Callable[[Any, int], Window] = common.layer_window,
    attention_extra: Callable[[ModelBuilder, int, str], dict[str, Any]] | None = None,
    uses_rope: Callable[[Any, int], bool] | None = None,
    mlp_name: str = "mlp",
    interleaved_rope: bool = False,
) -> DecoderLM:
    """Llama layout; ``qkv_bias``/``o_bias`` default to ``config.attention_bias``;
    ``attention_extra(b, layer, prefix)`` adds attention fields (e.g. GPT-OSS sinks,
    QK-norms); ``uses_rope(config, layer)`` False leaves that layer without rotary (NoPE
    layers); ``mlp_name`` is the MLP's module name in the checkpoint (Llama 4:
    ``feed_forward``); ``interleaved_rope`` rotates adjacent pairs (Llama 4's complex form)."""
    cfg = b.config
    _, _, hd = common.heads(cfg)
    eps = cfg.rms_norm_eps
    attention_bias = getattr(cfg, "attention_bias", False)
    bias = attention_bias if qkv_bias is None else qkv_bias
    out_bias = attention_bias if o_bias is None else o_bias
    rotaries = common.rotaries_by_type(cfg, hd, interleaved=interleaved_rope)
    rotary = rotaries[None]
    embed = common.embedding(b, "model.embed_tokens.weight")
    head = common.lm_head(b, cfg, embed)  # next to the table it may share: one copy at a time
    layers, windows = [], [window(cfg, i) for i in range(cfg.num_hidden_layers)]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = common.self_attention(
            b,
            i,
            f"{p}.self_attn",
            rotary=rotary if uses_rope is None or uses_rope(cfg, i) else None,
            qkv=qkv(b, f"{p}.self_attn", bias),
            o_bias=out_bias,
            window=window,
            **(attention_extra(b, i, f"{p}.self_attn") if attention_extra else {}),
        )
        layers.append(common.pre_norm_block(b, p, attn, mlp(b, f"{p}.{mlp_name}")))
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("model.norm", eps),
        head=head,
        rotaries=[rotary],
        windows=windows,
    )
