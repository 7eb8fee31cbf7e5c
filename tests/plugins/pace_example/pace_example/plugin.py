"""Entry point of pace-example: one RMSNorm kernel under the backend name ``example``.

The kernel counts its calls so tests can prove the engine really runs it.
"""

from __future__ import annotations

import torch

from pace_core import hookimpl
from pace_core.registry import Registrations

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

calls = 0  # incremented on every kernel call


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rms_norm`` contract: ``fn(x, weight, eps, residual|None) -> (y, x + residual)``."""
    global calls
    calls += 1
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), x


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    registry.add_kernel(
        op="rms_norm",
        backend="example",
        fn=rms_norm,
        dtypes=(torch.float32, torch.bfloat16),
        # Below native (0): ``auto`` never picks this demo kernel; pin it to use it.
        priority=-10,
        description="reference RMSNorm that counts its calls",
    )
