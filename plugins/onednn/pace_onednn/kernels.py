"""The op-catalogue wrappers: ``prepare`` packs weights into oneDNN objects, ``fn`` runs them.

Semantics follow ``pace_native.kernels``; compute is fp32-accumulated, and bf16 rounds once
per matmul output (gate's activation and the multiply by up happen before that rounding).
"""

from __future__ import annotations

from typing import Any

import torch

from pace_core import ops
from pace_onednn.build import extension

ACTIVATIONS = ops.ACTIVATIONS  # the core's vocabulary; csrc maps each name to a oneDNN eltwise


def prepare_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
    return extension().Dense(weight, bias)


def linear(x: torch.Tensor, w: Any) -> torch.Tensor:
    return w.forward(x)


def prepare_gated_mlp(
    gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, activation: str,
    limit: float | None = None,
) -> Any:  # fmt: skip
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if limit is not None:
        raise ValueError("pace-onednn gated_mlp has no clamp (limit) support")
    return extension().GatedMLP(gate, up, down, activation)


def gated_mlp(x: torch.Tensor, w: Any) -> torch.Tensor:
    return w.forward(x)
