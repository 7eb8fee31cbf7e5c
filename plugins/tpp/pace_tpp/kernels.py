"""pace op kernels on libxsmm BRGEMM: ``linear``, ``qkv_proj`` and fused ``gated_mlp``.

Each ``prepare_*`` re-blocks its weights once (see ``blocking``) and binds the C++ glue
(built on first use, see ``build``) with its arguments, so a call is one C++ dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_core import ops
from pace_tpp import build
from pace_tpp.blocking import Blocks, choose_blocks, pack, pack_pair

# The core's activation vocabulary; a name's code is its index (csrc enum kSilu..kRelu).
ACTIVATIONS = {name: code for code, name in enumerate(ops.ACTIVATIONS)}


@dataclass(frozen=True)
class Prepared:
    """Packed weights bound to a glue function: ``fn(x, *args)``; ``dtype`` is the weights'."""

    fn: Callable[..., torch.Tensor]
    args: tuple[Any, ...]
    dtype: torch.dtype
    blocks: Blocks

    @property
    def packed(self) -> torch.Tensor:
        return self.args[0]


def _run(x: torch.Tensor, w: Prepared) -> torch.Tensor:
    return w.fn(x if x.dtype == w.dtype else x.to(w.dtype), *w.args)


# -- linear ---------------------------------------------------------------------------------
def prepare_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Prepared:
    glue = build.load()
    n, k = (int(s) for s in weight.shape)
    blocks = choose_blocks(n, k, weight.dtype)
    b = None if bias is None else bias.detach().float().contiguous()  # added before rounding
    args = (pack(weight.detach(), blocks), b, n, k, blocks.bn, blocks.bk, blocks.bm)
    return Prepared(glue.linear, args, weight.dtype, blocks)


def linear(x: torch.Tensor, w: Prepared) -> torch.Tensor:
    return _run(x, w)


# -- fused QKV ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedQKV:
    linear: Prepared
    sizes: tuple[int, ...]


def prepare_qkv(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None = None
) -> PreparedQKV:
    sizes = tuple(int(w.shape[0]) for w in weights)
    bias = torch.cat(list(biases)) if biases is not None else None
    return PreparedQKV(prepare_linear(torch.cat(list(weights)), bias), sizes)


def qkv_proj(x: torch.Tensor, w: PreparedQKV) -> tuple[torch.Tensor, ...]:
    return _run(x, w.linear).split(w.sizes, dim=-1)


# -- gated MLP ------------------------------------------------------------------------------
def prepare_gated_mlp(
    gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, activation: str
) -> Prepared:
    """Gate/up panels interleaved ``[I/bn][gate, up][H/bk]...``; down packed like linear."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; tpp fuses {', '.join(ACTIVATIONS)}")
    glue = build.load()
    inter, hidden = (int(s) for s in gate.shape)
    blocks = choose_blocks(min(inter, hidden), min(inter, hidden), gate.dtype)
    gate_up = pack_pair(gate.detach(), up.detach(), blocks)
    args = (gate_up, pack(down.detach(), blocks), inter, hidden, ACTIVATIONS[activation],
            blocks.bn, blocks.bk, blocks.bm)  # fmt: skip
    return Prepared(glue.gated_mlp, args, gate.dtype, blocks)


def gated_mlp(x: torch.Tensor, w: Prepared) -> torch.Tensor:
    return _run(x, w)
