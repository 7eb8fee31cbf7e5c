"""Config readers and block assemblers shared by the model families."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from pace_core.errors import ModelLoadError
from pace_core.models.decoder import DecoderLM, ModelBuilder
from pace_core.models.layers import Bound, DenseMLP, Norm
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


def every_layer_window(cfg: Any, layer: int) -> int | None:
    """``config.sliding_window`` on every layer (Phi-3: no ``layer_types``, one mask for all)."""
    window = getattr(cfg, "sliding_window", None)
    return int(window) if window else None


def embedding(b: ModelBuilder, name: str) -> tuple[Bound, Any]:
    weight = b.tensor(name)
    k = b.kernel("embedding", vocab=int(weight.shape[0]))
    return Bound(k.fn, weight), weight


def lm_head(
    b: ModelBuilder, cfg: Any, embed_weight: Any, name: str = "lm_head", *, bias: bool = False
) -> Bound:
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


# HF ``hidden_act`` / ``activation_function`` names -> torch activations for DenseMLP.
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
}


def dense_mlp(
    b: ModelBuilder, fc1: str, fc2: str, activation: str, *, bias: bool = True
) -> DenseMLP:
    """``fc2(act(fc1(x)))`` from two linear layers (OPT ``fc1/fc2``, GPT-J ``fc_in/fc_out``)."""
    if activation not in TORCH_ACTIVATIONS:
        raise ModelLoadError(
            f"unsupported activation {activation!r}; supported: {', '.join(TORCH_ACTIVATIONS)}"
        )
    act = TORCH_ACTIVATIONS[activation]
    return DenseMLP(b.linear(fc1, bias=bias), b.linear(fc2, bias=bias), act)


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
    windows: Sequence[int | None] | None = None,
    **extra: Any,
) -> DecoderLM:
    """``windows`` (one per layer) defaults to :func:`layer_window` of each layer."""
    _, kv, hd = heads(cfg)
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
        num_kv_heads=[kv] * num_layers,
        head_dims=[hd] * num_layers,
        vocab_size=cfg.vocab_size,
        plan=b.plan,
        **extra,
    )


def self_attention(
    b: ModelBuilder,
    cfg: Any,
    layer: int,
    prefix: str,
    *,
    rotary: Rotary | None,
    bias: bool = False,
    o_bias: bool = False,
    scale: float | None = None,
    **extra: Any,
):
    """Attention from separate ``{q,k,v,o}_proj`` tensors under ``prefix`` (HF's usual names)."""
    n, kv, hd = heads(cfg)
    return b.attention(
        layer=layer,
        qkv=b.qkv([f"{prefix}.{x}_proj" for x in "qkv"], bias=bias),
        o_proj=b.linear(f"{prefix}.o_proj", bias=o_bias),
        rotary=rotary,
        num_heads=n,
        num_kv_heads=kv,
        head_dim=hd,
        scale=hd**-0.5 if scale is None else scale,
        window=layer_window(cfg, layer),
        **extra,
    )
