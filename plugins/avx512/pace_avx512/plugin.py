"""Entry point of pace-avx512: registers the AVX-512 kernels under the backend ``avx512``.

They run on AVX-512 CPUs natively and on AVX2 + FMA + F16C CPUs through the ``avx2`` build
target (each 512-bit intrinsic on two 256-bit registers, ``csrc/avx512_on_avx2.h``).

When the C++ extension gets built (the choice, and why):

- ``import``/registration never compiles by default: compiling takes about a minute, and
  every ``pace`` command and model load registers plugins.
- If a build for this CPU target, torch version and source hash is already cached, the hook
  imports it right away (a ``dlopen``, milliseconds). ``PACE_AVX512_EAGER=1`` makes the hook
  compile when nothing is cached (e.g. to pay the cost at container start).
- Otherwise the first *resolution* of one of these kernels compiles it: the ``supports``
  predicate calls :func:`pace_avx512.build.available`, so at the first model load that picks
  ``avx512``. If that build fails, the predicate returns the reason and the resolver falls
  back to ``native`` (the resolver never picks a kernel that then fails), and the failure is
  recorded so later processes register nothing, with the reason shown by ``pace plugins``.
- The hook raises (plugin "failed", registers nothing) when this CPU could run the kernels
  but they cannot be built here: no C++ compiler, no Python headers, no ninja, or an earlier
  failed build. On a CPU without AVX2 the kernels are registered anyway and the resolver
  skips them by their ``cpu_features``, which shows the reason in ``pace ops`` and op plans.

``pace build-kernels`` (this plugin's build step) builds ahead of time and retries a failed
build.
"""

from __future__ import annotations

import functools
import os

import torch

from pace_avx512 import build, dlrm, kernels, packing, qpacking, stack
from pace_core import hookimpl
from pace_core.registry import BuildNotApplicable, OpContext, Registrations

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

BACKEND = "avx512"
PRIORITY = 50  # above native (0)
DTYPES = (torch.float32, torch.bfloat16)
# What the compiled code needs on every target (the least of build.TARGETS) ...
BASE = build.AVX2_FEATURES
# bf16 matmuls use vdpbf16ps where the CPU has AVX512-BF16 (the `avx512bf16` build target) and
# widen bf16 to fp32 for FMAs where it does not (the `avx512` and `avx2` targets): no bf16
# check. The quantized-weight kernels (vpdpbusd) need VNNI on the AVX-512 targets (the avx2
# target emulates it), checked per weight format by build.int8_dot_problem.
MATRIX_FORMATS = ("dense", *qpacking.FORMATS)
CACHE_LAYOUTS = ("contiguous", "paged", "slab")
# Layouts whose caches the C++ stack writes itself: direct_buffers() / block_buffers().
STACK_LAYOUTS = CACHE_LAYOUTS
# KV storage dtypes the attention kernel and the stack read (int8: block pools only, whose
# rows the kernel de-quantizes; the caches refuse int8 on other layouts)
KV_DTYPES = ("auto", "int8")


def _quantized_problem(ctx: OpContext, fmt: str) -> str | None:
    """Why the VNNI kernels cannot take this op's quantized weights, or None."""
    if (why := build.int8_dot_problem()) is not None:
        return why
    rows = ("hidden", "intermediate") if ctx.op in ("gated_mlp", "moe") else ("in_features",)
    for attr in rows:
        k = getattr(ctx, attr, None)  # absent when `pace ops` asks generally
        if k is not None and (why := qpacking.problem(fmt, int(k))) is not None:
            return why
    return None


def _supports(ctx: OpContext) -> bool | str:
    fmt = ctx.attrs.get("weight_format") or "dense"
    if fmt != "dense" and (why := _quantized_problem(ctx, fmt)) is not None:
        return why
    if ctx.op in ("gated_mlp", "moe"):
        act = getattr(ctx, "activation", None)  # absent when `pace ops` asks generally
        have = (*packing.ACTIVATIONS, "swiglu_oai") if ctx.op == "moe" else packing.ACTIVATIONS
        if act is not None and act not in have:
            return f"activation {act!r} not implemented (have {', '.join(have)})"
    if ctx.op == "moe" and getattr(ctx, "biases", False) and ctx.activation != "swiglu_oai":
        return "expert biases only with 'swiglu_oai'"
    return build.available()


def _stack_supports(ctx: OpContext) -> bool | str:
    """The C++ loop covers blocks whose every op is an avx512 kernel, on contiguous and
    block (paged, slab) caches."""
    if getattr(ctx, "profiling", False):
        return "per-op profiling times each op (per-layer path)"
    blocks = getattr(ctx, "blocks", None)
    if blocks is not None and not blocks <= stack.FUSABLE_BLOCKS:
        return f"{', '.join(sorted(blocks - stack.FUSABLE_BLOCKS))} not fused"
    backends = getattr(ctx, "layer_backends", None)
    if backends is not None and backends != {BACKEND}:
        others = ", ".join(sorted(backends - {BACKEND}))
        return f"layer ops also on {others} (fusion needs every layer op on avx512)"
    layout = getattr(ctx, "cache_layout", None)  # None when `pace ops` asks generally
    if layout is not None and layout not in STACK_LAYOUTS:
        return f"fuses steps over {', '.join(STACK_LAYOUTS)} caches only, not {layout!r}"
    return build.available()


def _check_buildable() -> None:
    """Raise when this CPU could use the kernels but they cannot be built/loaded here."""
    build.EXT.check(load_cached=True)
    if build.target() is not None and os.environ.get("PACE_AVX512_EAGER", "") not in ("", "0"):
        build.load_extension()


def _prebuild() -> str:
    if build.target() is None:
        raise BuildNotApplicable(
            f"this CPU lacks {', '.join(build.AVX2_FEATURES)} (the kernels would never be used)"
        )
    return str(build.prebuild())


@hookimpl
def pace_register_builds(registry: Registrations) -> None:
    registry.add_build(BACKEND, _prebuild, description="AVX-512 kernels (C++, JIT; AVX2 build "
                       "on CPUs without AVX-512)")


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    _check_buildable()

    def add(op, fn, *, prepare=None, description="", **extra):
        registry.add_kernel(
            op, BACKEND, fn, dtypes=DTYPES, cpu_features=BASE, prepare=prepare,
            supports=_supports, priority=PRIORITY, description=description,
            **extra,
        )  # fmt: skip

    add("linear", kernels.linear, prepare=packing.prepare_linear, weight_formats=MATRIX_FORMATS,
        description="GEMV/GEMM over packed weights (bf16: vdpbf16ps, or FMA on widened "
        "bf16 without AVX512-BF16; fp32: FMA; int8/int4 and GGUF formats: vpdpbusd on "
        "15-bit activations)")  # fmt: skip
    add("qkv_proj", kernels.qkv_proj, prepare=packing.prepare_qkv, weight_formats=MATRIX_FORMATS,
        description="one GEMV/GEMM over the packed [wq; wk; wv]")  # fmt: skip
    add("gated_mlp", kernels.gated_mlp, prepare=packing.prepare_gated_mlp,
        weight_formats=MATRIX_FORMATS,
        description="gate/up in one pass with the activation fused, then down")  # fmt: skip
    add("moe", kernels.moe, prepare=packing.prepare_moe, weight_formats=MATRIX_FORMATS,
        description="experts as packed gated MLPs (GPT-OSS: packed linears + clamped SwiGLU): "
        "each hit expert's rows in one GEMM")  # fmt: skip
    add("rms_norm", kernels.rms_norm,
        description="RMSNorm with fused residual add (fp32 math)")  # fmt: skip
    add("layer_norm", kernels.layer_norm,
        description="LayerNorm with fused residual add (fp32 math, two-pass variance)")  # fmt: skip
    add("rope", kernels.rope,
        description="rotary embedding in place (neox or interleaved)")  # fmt: skip
    registry.add_kernel(
        "decoder_stack", BACKEND, stack.decoder_stack, dtypes=DTYPES, cpu_features=BASE,
        prepare=stack.prepare, supports=_stack_supports, priority=PRIORITY,
        weight_formats=MATRIX_FORMATS, packs_ragged=True, kv_dtypes=KV_DTYPES,
        description="all pre-norm/sandwich blocks of a step in one C++ call (contiguous, "
        "paged and slab caches, int8 KV rows quantized as written; ragged rows packed, no "
        "padding computed)",
    )  # fmt: skip
    dlrm_supports = functools.partial(dlrm.supports, quantized_problem=_quantized_problem)
    registry.add_kernel(
        "embedding_bag", BACKEND, dlrm.embedding_bag, dtypes=DTYPES, cpu_features=BASE,
        prepare=dlrm.prepare_embedding_bag, supports=dlrm_supports, priority=PRIORITY,
        weight_formats=("dense", "int8"),
        description="sum-pooled bags, fp32 accumulation; int8 tables scaled per row",
    )  # fmt: skip
    registry.add_kernel(
        "cross_interaction", BACKEND, dlrm.cross_interaction, dtypes=DTYPES, cpu_features=BASE,
        prepare=dlrm.prepare_cross_interaction, supports=dlrm_supports, priority=PRIORITY,
        weight_formats=MATRIX_FORMATS,
        description="DCNv2 cross layers in one C++ call: packed GEMMs (int8: VNNI, W8A8 "
        "weights with int8 activations) and the fused x0 * y + x_l",
    )  # fmt: skip
    add("attention", kernels.attention, cache_layouts=CACHE_LAYOUTS, kv_dtypes=KV_DTYPES,
        description="flash-style attention (decode and prefill), GQA, sinks, windows; reads "
        "paged/slab pools through the block table (int8 KV rows de-quantized per "
        "block)")  # fmt: skip
    add("latent_attention", kernels.latent_attention, cache_layouts=CACHE_LAYOUTS,
        description="MLA: the flash attention kernel over the latent rows as keys and values "
        "(all heads share each block in L1)")  # fmt: skip
