"""Entry point of pace-cpp-example: an RMSNorm written in C++ under the backend ``cppexample``.

``pace_core.jit`` compiles ``rms_norm.cpp`` on first use (once per machine, CPU target and
source: later processes import the cached build) and raises ``jit.BuildFailed`` with the
compiler's error when it cannot. The extension counts its calls (``calls()``) so tests can
prove the engine really runs it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch

from pace_core import hookimpl, jit
from pace_core.registry import OpContext, Registrations

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

SOURCE = Path(__file__).with_name("rms_norm.cpp")


@functools.cache  # kernels call it on every call: look the module up once
def extension() -> ModuleType:
    """The compiled kernels: built on first use, then imported from the cache."""
    return jit.build_extension("pace_cpp_example", [SOURCE], backend="cppexample")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rms_norm`` contract: ``fn(x, weight, eps, residual|None) -> (y, x + residual)``."""
    return extension().rms_norm(x, weight, eps, residual)


def supports(ctx: OpContext) -> bool | str:
    """Usable once built; if the build fails the resolver falls back and says why."""
    try:
        extension()
    except jit.BuildFailed as exc:
        return str(exc).splitlines()[0]
    return True


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    registry.add_kernel(
        op="rms_norm",
        backend="cppexample",
        fn=rms_norm,
        dtypes=(torch.float32, torch.bfloat16),
        supports=supports,
        # Below native (0): ``auto`` never picks this demo kernel; pin it to use it.
        priority=-10,
        description="RMSNorm in C++, built by pace_core.jit",
    )
