"""Rotary position tables for every HF rope type (default, linear, dynamic, yarn, longrope, llama3).

Frequencies come from transformers' own init functions, so the numbers match HF exactly; the
tables are computed once per step and shared by all layers of the same kind.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pace_core.errors import ConfigError
from pace_core.models import limits


def rope_parameters(config: Any, layer_type: str | None) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if "rope_type" not in params:
        params = {**params, "rope_type": "default"}
    return params


class Rotary:
    """cos/sin tables for one rope configuration; ``interleaved`` selects the GPT-J layout."""

    def __init__(
        self,
        config: Any,
        head_dim: int,
        *,
        layer_type: str | None = None,
        interleaved: bool = False,
        rotary_dim: int | None = None,
        base: float | None = None,
    ) -> None:
        self.config = config
        self.layer_type = layer_type
        self.interleaved = interleaved
        params = rope_parameters(config, layer_type)
        self.rope_type = params["rope_type"]
        self.max_positions = limits.max_positions(config) or 0
        self.original_max = limits.original_max_positions(config, params)
        self._kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        if self.rope_type == "default":
            theta = base if base is not None else params.get("rope_theta", 10000.0)
            dim = rotary_dim or int(head_dim * params.get("partial_rotary_factor", 1.0))
            arange = torch.arange(0, dim, 2, dtype=torch.int64).float()
            self.inv_freq = 1.0 / (theta ** (arange / dim))
            self.scaling = 1.0
        elif self.rope_type in ROPE_INIT_FUNCTIONS:
            self.inv_freq, self.scaling = ROPE_INIT_FUNCTIONS[self.rope_type](
                config, None, **self._kwargs
            )
        else:
            raise ConfigError(
                f"unsupported rope_type {self.rope_type!r}; supported: default, "
                f"{', '.join(ROPE_INIT_FUNCTIONS)}"
            )
        self._original_inv_freq = self.inv_freq
        self._long_inv_freq: torch.Tensor | None = None
        self.rotary_dim = 2 * self.inv_freq.shape[0]
        self._lookup: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _inv_freq_for(self, seq_len: int) -> torch.Tensor:
        if self.rope_type == "dynamic" and seq_len > self.max_positions:
            inv, self.scaling = ROPE_INIT_FUNCTIONS["dynamic"](
                self.config, None, seq_len=seq_len, **self._kwargs
            )
            return inv
        if self.rope_type == "longrope" and seq_len > self.original_max:
            if self._long_inv_freq is None:
                self._long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](
                    self.config, None, seq_len=self.original_max + 1, **self._kwargs
                )
            return self._long_inv_freq
        return self._original_inv_freq

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype, *, below: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[B, T, rotary_dim]`` for integer ``positions [B, T]`` (all below
        ``below`` when given). Frequencies that do not depend on the sequence length are
        looked up in tables over positions ``0..n-1``, grown as needed, computed by the same
        operations, so the values are the same."""
        if self.rope_type in ("dynamic", "longrope"):
            # Per row, from the row's own length (as if it ran alone), so that batching
            # (left padding, other rows' lengths) never changes a sequence's frequencies.
            lengths = (positions.max(dim=-1).values + 1).tolist()
            by_length = {n: self._inv_freq_for(n) for n in sorted(set(lengths))}
            inv_freq = torch.stack([by_length[n] for n in lengths])[:, None, :]  # [B, 1, R/2]
            return self._compute(positions, inv_freq, dtype)
        needed = int(positions.max()) + 1 if below is None else below
        cos, sin = self._lookup.get(dtype, (None, None))
        have = 0 if cos is None else cos.shape[0]
        if have < needed:  # doubling, not past the model's context unless a position is
            size = max(needed, 256, min(2 * have, self.max_positions or 2 * have))
            cos, sin = self._lookup[dtype] = self._compute(torch.arange(size), self.inv_freq, dtype)
        flat = positions.reshape(-1)
        shape = (*positions.shape, self.rotary_dim)
        return cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape)

    def _compute(
        self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * inv_freq
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)
