"""Config readers and block assemblers shared by the model families."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pace_core.caches.base import Window
from pace_core.errors import ModelLoadError
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import Attention, Bound, DenseMLP, Norm, PreNormBlock
from pace_core.models.rope import Rotary
from pace_core.models.text_part import TEXT_PREFIXES
from pace_core.ops import HF_ACTIVATIONS
from pace_core.quant import formats_of

SLIDING = "sliding_attention"


def heads(cfg: Any) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) from a HF config."""
    n = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or n
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // n
    return n, kv, hd


def layer_window(cfg: Any, layer: int) -> Window:
    """The sliding window of ``layer`` (None = full attention), from ``config.layer_types``."""
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None and types[layer] == SLIDING and window:
        return int(window)
    return None


def every_layer_window(cfg: Any, layer: int) -> int | None:
    """``config.sliding_window`` on every layer (Phi-3: no ``layer_types``, one mask for all)."""
    window = getattr(cfg, "sliding_window", None)
    return int(window) if window else None


def embedding(b: ModelBuilder, name: str, *, quantize: bool = True) -> Bound:
    """A lookup table (quantized like any matrix when the load asks, unless ``quantize`` is
    off); a tied LM head shares its weight (:func:`lm_head`)."""
    weight = b.tensor(name)
    if quantize:
        weight = b.matrix(weight, name.removesuffix(".weight"), head=True)
    k = b.kernel("embedding", vocab=int(weight.shape[0]), weight_format=formats_of([weight]))
    return Bound(k.fn, weight)


def lm_head(
    b: ModelBuilder, cfg: Any, embed: Bound, name: str = "lm_head", *, bias: bool = False
) -> Bound:
    """The output projection; tied to the embedding ``embed`` when the config says so (or there
    is no head). A tied head whose kernel keeps its own copy of the table and can read rows of
    it (a prepared weight with ``rows(ids)``) serves the lookup too: one copy, not two."""
    tied = getattr(cfg, "tie_word_embeddings", False) or not b.weights.has(f"{name}.weight")
    if tied and b.weights.has(f"{name}.weight"):
        b.weights.discard(f"{name}.weight")  # an explicit copy of the tied weight: harmless
    head = b.linear(name, bias=bias, weight=embed.weight if tied else None, head=True)
    rows = getattr(head.weight, "rows", None)
    if tied and rows is not None and head.weight is not embed.weight:
        embed.fn, embed.weight = _lookup_rows, head.weight
    return head


def _lookup_rows(ids: torch.Tensor, weight: Any) -> torch.Tensor:
    return weight.rows(ids.reshape(-1)).view(*ids.shape, -1)


def activation(name: str) -> str:
    """A HF ``hidden_act`` / ``activation_function`` name as a name of the kernels' activation
    vocabulary (``pace_core.ops.ACTIVATIONS``)."""
    if name not in HF_ACTIVATIONS:
        raise ModelLoadError(
            f"unsupported activation {name!r}; supported: {', '.join(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def gated_mlp(b: ModelBuilder, prefix: str, hf_activation: str) -> Bound:
    """``{prefix}.{gate,up,down}_proj`` with the HF activation ``hf_activation``."""
    return b.gated_mlp(
        b.tensor(f"{prefix}.gate_proj.weight"),
        b.tensor(f"{prefix}.up_proj.weight"),
        b.tensor(f"{prefix}.down_proj.weight"),
        activation(hf_activation),
        module=prefix,
    )


def dense_mlp(
    b: ModelBuilder, fc1: str, fc2: str, hf_activation: str, *, bias: bool = True
) -> DenseMLP:
    """``fc2(act(fc1(x)))`` from two linear layers (OPT ``fc1/fc2``, GPT-J ``fc_in/fc_out``)."""
    act = activation(hf_activation)
    return DenseMLP(b.linear(fc1, bias=bias), b.linear(fc2, bias=bias), act)


def pre_norm_block(b: ModelBuilder, prefix: str, attn: Any, mlp: Callable) -> PreNormBlock:
    """``attn`` and ``mlp`` between ``{prefix}.input_layernorm`` and
    ``{prefix}.post_attention_layernorm`` (RMSNorms with ``config.rms_norm_eps``)."""
    eps = b.config.rms_norm_eps
    return PreNormBlock(
        b.norm(f"{prefix}.input_layernorm", eps), attn,
        b.norm(f"{prefix}.post_attention_layernorm", eps), mlp,
    )  # fmt: skip


def rotaries_by_type(
    cfg: Any, head_dim: int, *, interleaved: bool = False
) -> dict[str | None, Rotary]:
    """One Rotary per layer type when rope parameters differ by type (Gemma 3), else one."""
    params = getattr(cfg, "rope_parameters", None) or {}
    types = set(getattr(cfg, "layer_types", None) or [])
    if types and types <= set(params):
        return {t: Rotary(cfg, head_dim, layer_type=t, interleaved=interleaved) for t in types}
    return {None: Rotary(cfg, head_dim, interleaved=interleaved)}


def assemble(
    b: ModelBuilder,
    cfg: Any,
    *,
    embed: Bound,
    layers: list,
    final_norm: Norm | None,
    head: Bound,
    rotaries: list[Rotary],
    windows: Sequence[Window] | None = None,
    cache_layers: Sequence[tuple[int, int, int]] | None = None,
    **extra: Any,
) -> DecoderLM:
    """``windows`` (one per layer) defaults to :func:`layer_window` of each layer;
    ``cache_layers`` = (KV heads, key dim, value dim) of each cache layer when they are not the
    config's heads on every layer (a latent cache: ``(1, rank + rope, 0)``; Gemma 4: per-layer
    head dims, fewer cache layers than blocks)."""
    if cache_layers is None:
        _, kv, hd = heads(cfg)
        cache_layers = [(kv, hd, hd)] * len(layers)
    kvs, hds, vds = (list(column) for column in zip(*cache_layers))
    num_layers = len(layers)
    if windows is None:
        windows = [layer_window(cfg, i) for i in range(num_layers)]
    return DecoderLM(
        config=cfg,
        dtype=b.dtype,
        embed=embed,
        layers=layers,
        stack=b.stack(layers),
        final_norm=final_norm,
        lm_head=head,
        rotaries=rotaries,
        windows=set(windows),
        num_layers=num_layers,
        num_kv_heads=kvs,
        head_dims=hds,
        value_dims=None if vds == hds else vds,
        vocab_size=cfg.vocab_size,
        plan=b.plan,
        **extra,
    )


def self_attention(
    b: ModelBuilder,
    layer: int,
    prefix: str,
    *,
    rotary: Rotary | None,
    qkv: Bound | None = None,
    bias: bool = False,
    o_proj: str = "o_proj",
    o_bias: bool = False,
    scale: float | None = None,
    window: Callable[[Any, int], Window] = layer_window,
    **extra: Any,
) -> Attention:
    """The attention of every family: Q/K/V from ``{prefix}.{q,k,v}_proj`` (HF's usual names)
    unless ``qkv`` is given, the output projection ``{prefix}.{o_proj}``, heads from the
    config, ``scale`` ``head_dim ** -0.5`` unless given and the layer's window by the
    ``window`` rule; ``extra`` are further :class:`Attention` fields (QK-norms, sinks)."""
    n, kv, hd = heads(b.config)
    if qkv is None:
        qkv = b.qkv([f"{prefix}.{x}_proj" for x in "qkv"], bias=bias)
    return b.attention(
        layer=layer,
        qkv=qkv,
        o_proj=b.linear(f"{prefix}.{o_proj}", bias=o_bias),
        rotary=rotary,
        num_heads=n,
        num_kv_heads=kv,
        head_dim=hd,
        scale=hd**-0.5 if scale is None else scale,
        window=window(b.config, layer),
        **extra,
    )


def build_text_part(b: ModelBuilder, build: Callable[[ModelBuilder], DecoderLM]) -> DecoderLM:
    """The text model of a multimodal ``*ForConditionalGeneration`` checkpoint (Gemma 3,
    Gemma 4, Llama 4): its ``text_config`` and language-model weights, built by the text
    ``build``."""
    text_config = getattr(b.config, "text_config", None)
    if text_config is None:
        raise ModelLoadError(f"{b.config.model_type} config has no text_config")
    for old, new in TEXT_PREFIXES:
        b.weights.rename_prefix(old, new)
    if not hasattr(text_config, "tie_word_embeddings"):
        text_config.tie_word_embeddings = getattr(b.config, "tie_word_embeddings", True)
    b.config = text_config
    return build(b)
