"""How a model splits N ways: the families that can, the sizes that must divide, the config of
one rank's shard and the part of each checkpoint tensor a rank reads.

A rank's shard is the model with ``1/N`` of the attention heads, KV heads and intermediate
(and expert intermediate) size, so the families build it unchanged from a config that says
so (:func:`shard_config`) and a weight store that hands out the matching slices
(:func:`slice_rule`). The vocabulary is split in ``ceil(V / N)`` rows per rank, the last
rank's padded with zero rows.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from pace_core.errors import ConfigError
from pace_core.models.common import heads
from pace_core.models.weights import Slice, SliceRule

# model_type -> family (the Llama-layout families and Gemma 3, dense and MoE)
FAMILIES = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE", "smollm3": "SmolLM3", "gemma3_text": "Gemma 3",
    "gemma3": "Gemma 3",
}  # fmt: skip

# checkpoint name -> (dim, halves): split dim ``dim`` of the tensor N ways (each of
# ``halves`` equal blocks on its own: a fused gate|up)
_COLUMN = re.compile(r".*\.self_attn\.[qkv]_proj\.(weight|bias)$|"
                     r".*\.mlp\.(experts\.\d+\.)?(gate|up)_proj\.weight$")  # fmt: skip
_ROW = re.compile(r".*\.self_attn\.o_proj\.weight$|.*\.mlp\.(experts\.\d+\.)?down_proj\.weight$")
_FUSED_GATE_UP = re.compile(r".*\.mlp\.experts\.gate_up_proj$")  # [E, 2I, H]
_FUSED_DOWN = re.compile(r".*\.mlp\.experts\.down_proj$")  # [E, H, I]
_HEAD = re.compile(r"(.*\.)?lm_head\.(weight|bias)$")
_O_BIAS = re.compile(r".*\.self_attn\.o_proj\.bias$")  # added once: rank 0's, zeros elsewhere


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _sizes(cfg: Any) -> dict[str, int]:
    """The sizes a rank count must divide, by config name."""
    n, kv, _ = heads(cfg)
    out = {"num_attention_heads": n, "num_key_value_heads": kv,
           "intermediate_size": int(cfg.intermediate_size)}  # fmt: skip
    moe = getattr(cfg, "moe_intermediate_size", None)
    if moe and getattr(cfg, "num_experts", 0):
        out["moe_intermediate_size"] = int(moe)
    return out


def text_config(cfg: Any) -> Any:
    """The language model's config (a multimodal wrapper's ``text_config``)."""
    return getattr(cfg, "text_config", None) or cfg


def check(cfg: Any, size: int) -> None:
    """ConfigError unless ``cfg``'s model splits ``size`` ways (its family, its sizes)."""
    model_type = getattr(cfg, "model_type", None)
    if model_type not in FAMILIES:
        names = ", ".join(sorted(set(FAMILIES.values())))
        raise ConfigError(
            f"tensor_parallel={size}: model_type {model_type!r} cannot be split across ranks; "
            f"tensor parallelism supports {names} ({', '.join(sorted(FAMILIES))})"
        )
    sizes = _sizes(text_config(cfg))
    bad = {k: v for k, v in sizes.items() if v % size}
    if bad:
        valid = divisors(math.gcd(*sizes.values()))
        listed = ", ".join(f"{k} ({v})" for k, v in sizes.items())
        named = ", ".join(f"{k} ({v})" for k, v in bad.items())
        raise ConfigError(
            f"tensor_parallel={size} does not divide {named}; "
            f"each rank takes an equal share of {listed}: valid tensor_parallel sizes for this "
            f"model are {', '.join(map(str, valid))}"
        )


def shard_config(cfg: Any, size: int) -> Any:
    """A copy of ``cfg`` describing one rank's shard: ``1/size`` of the heads, KV heads and
    intermediate sizes (the head dim written out, the vocabulary and hidden size whole)."""
    out = copy.deepcopy(cfg)
    text = text_config(out)
    n, kv, hd = heads(text)
    text.head_dim = hd
    text.num_attention_heads = n // size
    text.num_key_value_heads = kv // size
    for name in ("intermediate_size", "moe_intermediate_size"):
        if getattr(text, name, None):
            setattr(text, name, int(getattr(text, name)) // size)
    return out


def vocab_rows(vocab: int, rank: int, size: int) -> tuple[int, int, int]:
    """(first row, end row, padded rows) of ``rank``'s share of a ``vocab``-row head."""
    per = -(-vocab // size)
    first = min(vocab, rank * per)
    return first, min(vocab, first + per), per


def _split(length: int, rank: int, size: int, halves: int = 1) -> tuple[tuple[int, int], ...]:
    block = length // halves
    part = block // size
    return tuple((h * block + rank * part, h * block + (rank + 1) * part) for h in range(halves))


def slice_rule(rank: int, size: int) -> SliceRule:
    """The part of each checkpoint tensor rank ``rank`` of ``size`` reads."""

    def rule(name: str, shape: tuple[int, ...]) -> Slice | None:
        if _COLUMN.fullmatch(name):
            return Slice(0, _split(shape[0], rank, size))
        if _ROW.fullmatch(name):
            return Slice(1, _split(shape[1], rank, size))
        if _FUSED_GATE_UP.fullmatch(name):
            return Slice(1, _split(shape[1], rank, size, halves=2))
        if _FUSED_DOWN.fullmatch(name):
            return Slice(2, _split(shape[2], rank, size))
        if _O_BIAS.fullmatch(name):
            return None if rank == 0 else Slice(0, ((0, 0),), pad_to=shape[0])
        if _HEAD.fullmatch(name):
            first, end, per = vocab_rows(shape[0], rank, size)
            return Slice(0, ((first, end),), pad_to=per)
        return None

    return rule
