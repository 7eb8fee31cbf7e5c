"""Entry point of pace-onednn: registers oneDNN ``linear`` and ``gated_mlp`` kernels.

Registration only checks that oneDNN, its headers and a compiler (or a cached build) are
present, and raises ``OneDNNUnavailable`` otherwise, so ``pace plugins`` shows the plugin as
failed with the reason. The glue itself is compiled when a model first resolves one of these
kernels (see ``build``); if that fails, the kernels decline with the reason.
"""

from __future__ import annotations

import torch

from pace_core import hookimpl
from pace_core.cpu import detect_cpu
from pace_core.registry import OpContext, Registrations
from pace_onednn import build, kernels

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

# Under `auto`: below pace-avx512 (50) and pace-tpp (40), which decode faster here; oneDNN
# wins only large-matrix prefill GEMMs against tpp (docs/performance.md).
PRIORITY = 30
DTYPES = (torch.float32, torch.bfloat16)


def bf16_unavailable() -> str | None:
    """Why this CPU cannot run the bf16 kernels, or None: oneDNN's fast bf16 matmul is brgemm
    avx512_core_bf16; below that it is emulated or absent (no primitive on AVX2)."""
    if not detect_cpu().has("avx512bw", "avx512_bf16"):
        return "bf16 needs avx512_bf16 (oneDNN brgemm avx512_core_bf16)"
    return None


def _linear_ok(ctx: OpContext) -> bool | str:
    if ctx.dtype == torch.bfloat16 and (reason := bf16_unavailable()):
        return reason
    return build.unavailable() or True  # builds the glue on the first resolve


def _mlp_ok(ctx: OpContext) -> bool | str:
    act = getattr(ctx, "activation", None)
    if act is not None and act not in kernels.ACTIVATIONS:
        return f"activation {act!r} unsupported (supports {', '.join(kernels.ACTIVATIONS)})"
    return _linear_ok(ctx)


@hookimpl
def pace_register_builds(registry: Registrations) -> None:
    registry.add_build("onednn", build.prebuild, description="oneDNN glue (C++, JIT)")


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    build.check()
    registry.add_kernel(
        "linear", "onednn", kernels.linear, prepare=kernels.prepare_linear, dtypes=DTYPES,
        supports=_linear_ok, priority=PRIORITY,
        description="oneDNN matmul, weights prepacked, primitive per M",
    )  # fmt: skip
    registry.add_kernel(
        "gated_mlp", "onednn", kernels.gated_mlp, prepare=kernels.prepare_gated_mlp,
        dtypes=DTYPES, supports=_mlp_ok, priority=PRIORITY,
        description="oneDNN up, gate with act+mul post-ops, down",
    )  # fmt: skip
