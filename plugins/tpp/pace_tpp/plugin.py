"""Entry point of pace-tpp: libxsmm BRGEMM kernels for ``linear``, ``qkv_proj``, ``gated_mlp``.

Registration only checks that libxsmm and a toolchain are present (and that no earlier build
failed); raising here makes ``pace plugins`` list the plugin as failed with the reason. The
glue is built on first use: each ``supports`` predicate loads it, so a build that fails in
this process makes the resolver fall back to another backend with that reason.
"""

from __future__ import annotations

import torch

from pace_core import hookimpl
from pace_core.cpu import detect_cpu
from pace_core.registry import OpContext, Registrations
from pace_tpp import build, kernels

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

# Under `auto`: below pace-avx512 (50), above pace-onednn (30): measured faster at decode
# (GEMV, fused gated MLP) in bf16 and fp32 on every shape (docs/performance.md).
PRIORITY = 40
CPU_FEATURES = ("avx512f",)  # libxsmm 1.17 JITs no BRGEMM for AVX2 ("target hsw")
BF16_FEATURES = ("avx512bw", "avx512vl", "avx512_bf16")


def _supports(ctx: OpContext) -> bool | str:
    """bf16 needs AVX512-BF16 (libxsmm's cpx kernels); every dtype needs the built glue."""
    if ctx.dtype == torch.bfloat16 and not detect_cpu().has(*BF16_FEATURES):
        missing = sorted(set(BF16_FEATURES) - detect_cpu().features)
        return f"bf16 BRGEMM needs {', '.join(missing)}"
    return build.unavailable_reason() or True


def _supports_gated_mlp(ctx: OpContext) -> bool | str:
    activation = getattr(ctx, "activation", None)
    if activation is not None and activation not in kernels.ACTIVATIONS:
        fused = ", ".join(kernels.ACTIVATIONS)
        return f"activation {activation!r} is not fused (tpp fuses {fused})"
    return _supports(ctx)


@hookimpl
def pace_register_builds(registry: Registrations) -> None:
    registry.add_build("tpp", build.prebuild, description="libxsmm glue (C++, JIT)")


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    build.GLUE.check()  # libxsmm, an earlier failed build, the toolchain (compiles nothing)
    common = dict(dtypes=(torch.float32, torch.bfloat16), cpu_features=CPU_FEATURES,
                  priority=PRIORITY)  # fmt: skip
    registry.add_kernel(
        "linear",
        "tpp",
        kernels.linear,
        prepare=kernels.prepare_linear,
        supports=_supports,
        description="libxsmm blocked BRGEMM",
        **common,
    )
    registry.add_kernel(
        "qkv_proj",
        "tpp",
        kernels.qkv_proj,
        prepare=kernels.prepare_qkv,
        supports=_supports,
        description="one packed Q/K/V BRGEMM",
        **common,
    )
    registry.add_kernel(
        "gated_mlp",
        "tpp",
        kernels.gated_mlp,
        supports=_supports_gated_mlp,
        prepare=kernels.prepare_gated_mlp,
        description="gate/up BRGEMM + activation + down BRGEMM",
        **common,
    )
