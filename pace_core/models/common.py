"""Config readers and block assemblers shared by the model families."""

from __future__ import annotations

from typing import Any

from pace_core.models.decoder import DecoderLM, ModelBuilder
from pace_core.models.layers import Bound, Norm
from pace_core.models.rope import Rotary

SLIDING = "sliding_attention"


def heads(cfg: Any) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) from a HF config."""
    n = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or n
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // n
    return n, kv, hd


def layer_window(cfg: Any, layer: int) -> int | None:
    """The sliding window of ``layer`` (None = full attention), from ``config.layer_types``."""
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None and types[layer] == SLIDING and window:
        return int(window)
    return None


def embedding(b: ModelBuilder, name: str) -> tuple[Bound, Any]:
    weight = b.tensor(name)
    k = b.kernel("embedding", vocab=int(weight.shape[0]))
    return Bound(k.fn, weight), weight


def lm_head(b: ModelBuilder, cfg: Any, embed_weight: Any, name: str = "lm_head", *, bias: bool = False) -> Bound:
    """The output projection; tied to the embedding when the config says so (or no head)."""
    tied = getattr(cfg, "tie_word_embeddings", False) or not b.weights.has(f"{name}.weight")
    if tied and b.weights.has(f"{name}.weight"):
        b.weights.take(f"{name}.weight")  # an explicit copy of the tied weight: harmless
    return b.linear(name, bias=bias, weight=embed_weight if tied else None)


def gated_mlp(b: ModelBuilder, prefix: str, activation: str) -> Bound:
    return b.gated_mlp(
        b.tensor(f"{prefix}.gate_proj.weight"),
        b.tensor(f"{prefix}.up_proj.weight"),
        b.tensor(f"{prefix}.down_proj.weight"),
        activation,
    )


def rotaries_by_type(cfg: Any, head_dim: int) -> dict[str | None, Rotary]:
    """One Rotary per layer type when rope parameters differ by type (Gemma 3), else one."""
    params = getattr(cfg, "rope_parameters", None) or {}
    types = set(getattr(cfg, "layer_types", None) or [])
    if types and types <= set(params):
        return {t: Rotary(cfg, head_dim, layer_type=t) for t in types}
    return {None: Rotary(cfg, head_dim)}


def assemble(
    b: ModelBuilder,
    cfg: Any,
    *,
    embed: Bound,
    layers: list,
    final_norm: Norm | None,
    head: Bound,
    rotaries: list[Rotary],
    **extra: Any,
) -> DecoderLM:
    n, kv, hd = heads(cfg)
    num_layers = len(layers)
    return DecoderLM(
        config=cfg,
        dtype=b.dtype,
        embed=embed,
        layers=layers,
        final_norm=final_norm,
        lm_head=head,
        rotaries=rotaries,
        windows={layer_window(cfg, i) for i in range(num_layers)},
        num_layers=num_layers,
        num_kv_heads=[kv] * num_layers,
        head_dims=[hd] * num_layers,
        vocab_size=cfg.vocab_size,
        plan=b.plan,
        **extra,
    )
