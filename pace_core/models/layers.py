"""Decoder building blocks shared by every model family.

Blocks hold kernels bound at build time (plain callables plus prepared weights): the forward
pass never consults the plugin system. Hidden states travel as ``(x, residual)`` pairs so
norms can fuse the residual add; the true hidden state is ``x + residual``.

These classes are the core's own. What a block consists of is public through ``describe()``
(the frozen descriptions of :mod:`pace_core.stack_spec`), which is all a backend fusing
``decoder_stack`` may read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from pace_core.caches.base import Window
from pace_core.models.rope import Rotary
from pace_core.stack_spec import (
    AttentionSpec,
    BlockSpec,
    DenseMLPSpec,
    GatedMLPSpec,
    MLPSpec,
    NormSpec,
    OpaqueMLP,
    RopeSpec,
    TemperatureTuning,
)

Kernel = Callable[..., Any]
Residual = torch.Tensor | None

# The activation vocabulary (pace_core.ops.ACTIVATIONS) as torch functions, for DenseMLP.
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class KVStore(Protocol):
    """What attention needs from a KV cache during a forward pass."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Any: ...


@dataclass
class StepContext:
    """Per-forward data shared by all layers: the cache, positions and rope tables."""

    cache: KVStore
    positions: torch.Tensor  # [B, T]
    rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    meta: Any = None  # the cache's StepMeta (fused decoder stacks read it)
    views: dict[int, Any] = field(default_factory=dict)  # cache layer -> this step's view
    per_layer: torch.Tensor | None = None  # [B, T, layers, P] per-layer inputs (Gemma 4)
    # only the last position's output is used: layers that write no cache may compute it alone
    last_only: bool = False


class Bound:
    """A kernel bound to its prepared weight: ``Bound(fn, w)(x) == fn(x, w)``."""

    __slots__ = ("fn", "weight")

    def __init__(self, fn: Kernel, weight: Any) -> None:
        self.fn, self.weight = fn, weight

    def __call__(self, x: torch.Tensor) -> Any:
        return self.fn(x, self.weight)


class GatedMLP(Bound):
    """The ``gated_mlp`` kernel bound to its prepared weight, with what it computes."""

    __slots__ = ("activation", "hidden", "intermediate")

    def __init__(
        self, fn: Kernel, weight: Any, activation: str, hidden: int, intermediate: int
    ) -> None:
        super().__init__(fn, weight)
        self.activation, self.hidden, self.intermediate = activation, hidden, intermediate

    def describe(self) -> GatedMLPSpec:
        return GatedMLPSpec(self, self.activation, self.hidden, self.intermediate)


def describe_mlp(mlp: Callable) -> MLPSpec:
    """The description of a block's MLP; a callable without ``describe`` stays opaque."""
    describe = getattr(mlp, "describe", None)
    return describe() if describe is not None else OpaqueMLP(mlp)


class Norm:
    """RMSNorm or LayerNorm with fused residual add: ``norm(x, residual) -> (y, x+residual)``."""

    __slots__ = ("bias", "eps", "fn", "is_rms", "weight")

    def __init__(
        self,
        fn: Kernel,
        weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
        *,
        is_rms: bool = True,
    ) -> None:
        self.fn, self.weight, self.eps, self.bias, self.is_rms = fn, weight, eps, bias, is_rms

    def __call__(
        self, x: torch.Tensor, residual: Residual = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_rms:
            return self.fn(x, self.weight, self.eps, residual)
        return self.fn(x, self.weight, self.bias, self.eps, residual)

    def describe(self) -> NormSpec:
        op = "rms_norm" if self.is_rms else "layer_norm"
        return NormSpec(op, self.fn, self.weight, self.eps, self.bias)


def _describe_norm(norm: Norm | None) -> NormSpec | None:
    return None if norm is None else norm.describe()


@dataclass
class Attention:
    """Multi-head attention with GQA, optional QK-norm (before or after rope), rope, sliding or
    chunked window, sinks and query temperature."""

    qkv: Bound
    o_proj: Bound
    attend: Kernel
    rope_fn: Kernel | None
    rotary: Rotary | None
    layer: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: Window = None
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    sinks: torch.Tensor | None = None
    norms_after_rope: bool = False
    temperature: TemperatureTuning | None = None
    v_norm: Norm | None = None

    def __call__(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x)
        q = q.view(b, t, self.num_heads, self.head_dim)
        k = k.view(b, t, self.num_kv_heads, self.head_dim)
        v = v.view(b, t, self.num_kv_heads, self.head_dim)
        if not self.norms_after_rope:
            q, k = self._qk_norms(q, k)
        if self.rope_fn is not None:
            cos, sin = step.rope[id(self.rotary)]
            q, k = self.rope_fn(q, k, cos, sin, self.rotary.interleaved)
        if self.norms_after_rope:
            q, k = self._qk_norms(q, k)
        if self.temperature is not None:
            q = (q * self.temperature.scales(step.positions)[:, :, None, None]).to(q.dtype)
        if self.v_norm is not None:
            v = self.v_norm(v)[0]
        view = step.views[self.layer] = step.cache.update(
            self.layer, k.transpose(1, 2), v.transpose(1, 2)
        )
        out = self.attend(q.transpose(1, 2), view, self.scale, self.sinks, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))

    def _qk_norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.q_norm is not None:
            q = self.q_norm(q)[0]
        if self.k_norm is not None:
            k = self.k_norm(k)[0]
        return q, k

    def describe(self) -> AttentionSpec:
        rope = None
        if self.rope_fn is not None and self.rotary is not None:
            rope = RopeSpec(self.rope_fn, self.rotary, bool(self.rotary.interleaved))
        return AttentionSpec(
            layer=self.layer,
            qkv=self.qkv,
            o_proj=self.o_proj,
            attend=self.attend,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            scale=float(self.scale),
            window=self.window,
            sinks=self.sinks,
            q_norm=_describe_norm(self.q_norm),
            k_norm=_describe_norm(self.k_norm),
            rope=rope,
            norms_after_rope=self.norms_after_rope,
            temperature=self.temperature,
            v_norm=_describe_norm(self.v_norm),
        )


class DenseMLP:
    """``fc2(act(fc1(x)))`` (OPT, GPT-J); ``activation`` is a name of ``TORCH_ACTIVATIONS``."""

    __slots__ = ("act", "activation", "fc1", "fc2")

    def __init__(self, fc1: Bound, fc2: Bound, activation: str) -> None:
        self.fc1, self.fc2, self.activation = fc1, fc2, activation
        self.act = TORCH_ACTIVATIONS[activation]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def describe(self) -> DenseMLPSpec:
        return DenseMLPSpec(self.fc1, self.fc2, self.activation)


class PreNormBlock:
    """``h += attn(norm1(h)); h += mlp(norm2(h))`` — Llama, Qwen2, Phi3, OPT, GPT-OSS."""

    __slots__ = ("attn", "mlp", "norm1", "norm2")
    kind = "pre_norm"

    def __init__(self, norm1: Norm, attn: Attention, norm2: Norm, mlp: Callable) -> None:
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def __call__(self, x: torch.Tensor, residual: Residual, step: StepContext):
        h, residual = self.norm1(x, residual)
        h, residual = self.norm2(self.attn(h, step), residual)
        return self.mlp(h), residual

    def describe(self) -> BlockSpec:
        return _block(self.kind, (self.norm1, self.norm2), self.attn, self.mlp)


class SandwichBlock:
    """Gemma: norms before and after both attention and MLP."""

    __slots__ = ("attn", "mlp", "post_attn", "post_mlp", "pre_attn", "pre_mlp")
    kind = "sandwich"

    def __init__(
        self,
        pre_attn: Norm,
        attn: Attention,
        post_attn: Norm,
        pre_mlp: Norm,
        mlp: Callable,
        post_mlp: Norm,
    ) -> None:
        self.pre_attn, self.attn, self.post_attn = pre_attn, attn, post_attn
        self.pre_mlp, self.mlp, self.post_mlp = pre_mlp, mlp, post_mlp

    def __call__(self, x: torch.Tensor, residual: Residual, step: StepContext):
        h, residual = self.pre_attn(x, residual)
        h = self.post_attn(self.attn(h, step))[0]
        h, residual = self.pre_mlp(h, residual)
        return self.post_mlp(self.mlp(h))[0], residual

    def describe(self) -> BlockSpec:
        norms = (self.pre_attn, self.post_attn, self.pre_mlp, self.post_mlp)
        return _block(self.kind, norms, self.attn, self.mlp)


class ParallelBlock:
    """GPT-J: attention and MLP both read ``norm(h)``; ``h += attn + mlp``."""

    __slots__ = ("attn", "mlp", "norm")
    kind = "parallel"

    def __init__(self, norm: Norm, attn: Attention, mlp: Callable) -> None:
        self.norm, self.attn, self.mlp = norm, attn, mlp

    def __call__(self, x: torch.Tensor, residual: Residual, step: StepContext):
        h, residual = self.norm(x, residual)
        return self.attn(h, step) + self.mlp(h), residual

    def describe(self) -> BlockSpec:
        return _block(self.kind, (self.norm,), self.attn, self.mlp)


class PostNormBlock:
    """OPT-350m style: ``h = norm1(h + attn(h)); h = norm2(h + mlp(h))``."""

    __slots__ = ("attn", "mlp", "norm1", "norm2")
    kind = "post_norm"

    def __init__(self, attn: Attention, norm1: Norm, mlp: Callable, norm2: Norm) -> None:
        self.attn, self.norm1, self.mlp, self.norm2 = attn, norm1, mlp, norm2

    def __call__(self, x: torch.Tensor, residual: Residual, step: StepContext):
        if residual is not None:
            x = x + residual
        h = self.norm1(self.attn(x, step), x)[0]
        return self.norm2(self.mlp(h), h)[0], None

    def describe(self) -> BlockSpec:
        return _block(self.kind, (self.norm1, self.norm2), self.attn, self.mlp)


def _block(kind: str, norms: tuple[Norm, ...], attn: Attention, mlp: Callable) -> BlockSpec:
    return BlockSpec(kind, tuple(n.describe() for n in norms), attn.describe(), describe_mlp(mlp))
