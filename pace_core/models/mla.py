"""Multi-head latent attention (DeepSeek-V2/V3 MLA) over a latent KV cache.

Keys and values of every head are linear in one compressed latent per token (``kv_b_proj``),
so the cache keeps only that latent and the shared rope key: ``[latent (rank) | k_pe]`` per
token and layer, one KV head, no values (``rank + rope_dim`` numbers instead of ``heads *
(nope + rope + v_dim) ``: 576 vs 40,960 for DeepSeek-V3). Attention runs in the latent space
("absorbed" form): each head's non-rope query goes through its slice of the key expansion
(``w_uk``) once per step, scores are ``q_abs . latent + q_pe . k_pe``, and the latent-space
output goes through the value expansion (``w_uv``) — the same numbers as expanding K and V.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pace_core.models.layers import Bound, Kernel, Norm, StepContext
from pace_core.models.rope import Rotary
from pace_core.stack_spec import LatentAttentionSpec, RopeSpec


@dataclass
class LatentAttention:
    """One MLA layer (see the module doc and :class:`~pace_core.stack_spec.LatentAttentionSpec`)."""

    layer: int
    q: Callable[[torch.Tensor], torch.Tensor]  # h -> [.., heads * (nope + rope_dim)]
    kv_a: Bound  # h -> [.., rank + rope_dim]
    kv_norm: Norm
    w_uk: torch.Tensor  # [heads, nope, rank]
    w_uv: torch.Tensor  # [heads, v_dim, rank]
    o_proj: Bound
    attend: Kernel  # op latent_attention
    rope_fn: Kernel
    rotary: Rotary
    num_heads: int
    nope: int
    rope_dim: int
    scale: float

    @property
    def rank(self) -> int:
        return int(self.w_uk.shape[-1])

    def __call__(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.num_heads, self.nope + self.rope_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a(x).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent)[0]
        cos, sin = step.rope[id(self.rotary)]
        q_pe, k_pe = self.rope_fn(
            q_pe.contiguous(), k_pe.reshape(b, t, 1, self.rope_dim), cos, sin,
            self.rotary.interleaved,
        )  # fmt: skip
        q_abs = torch.einsum("bthd,hdr->bthr", q_nope, self.w_uk)
        queries = torch.cat((q_abs, q_pe), dim=-1).transpose(1, 2)
        keys = torch.cat((latent[:, :, None], k_pe), dim=-1).transpose(1, 2)
        view = step.cache.update(self.layer, keys, keys.new_empty(b, 1, t, 0))
        out = self.attend(queries, view, self.scale, self.rank)  # [B, H, T, rank]
        out = torch.einsum("bhtr,hvr->bthv", out, self.w_uv)
        return self.o_proj(out.reshape(b, t, -1))

    def describe(self) -> LatentAttentionSpec:
        return LatentAttentionSpec(
            layer=self.layer,
            q=self.q,
            kv_a=self.kv_a,
            kv_norm=self.kv_norm.describe(),
            w_uk=self.w_uk,
            w_uv=self.w_uv,
            o_proj=self.o_proj,
            attend=self.attend,
            num_heads=self.num_heads,
            nope=self.nope,
            rope_dim=self.rope_dim,
            rank=self.rank,
            v_dim=int(self.w_uv.shape[1]),
            scale=float(self.scale),
            rope=RopeSpec(self.rope_fn, self.rotary, bool(self.rotary.interleaved)),
        )


class LowRankQuery:
    """DeepSeek's query path with ``q_lora_rank``: ``q_b(norm(q_a(h)))``."""

    __slots__ = ("norm", "q_a", "q_b")

    def __init__(self, q_a: Bound, norm: Norm, q_b: Bound) -> None:
        self.q_a, self.norm, self.q_b = q_a, norm, q_b

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_b(self.norm(self.q_a(x))[0])
