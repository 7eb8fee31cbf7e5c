"""DLRMv2's ops on AVX-512 (``csrc/dlrm.cpp``, ``csrc/dlrm_ops.cpp``).

- ``embedding_bag``: fp32, bf16 or int8 tables (int8: one fp32 scale per row, from a
  ``QuantizedWeight`` with ``group_size`` D), fp32 sums in registers, one rounding to the
  model dtype. The table is kept as given (no copy of a multi-GB table at load).
- ``cross_interaction``: all layers in one C++ call: ``V`` and ``U`` as packed dense matrices
  (fp32 FMA / bf16 ``vdpbf16ps``, :mod:`pace_avx512.packing`) or as quantized packs run by the
  VNNI kernel (:mod:`pace_avx512.qpacking`; W8A8 weights take int8 activations with a dynamic
  scale per row and 32 values), then ``x0 * y + x_l`` fused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_avx512 import build, packing, qpacking
from pace_core.quant import QuantizedWeight
from pace_core.registry import OpContext

_E: Any = None  # the loaded extension, looked up once


def _ext() -> Any:
    global _E
    _E = build.load_extension()
    return _E


@dataclass(frozen=True)
class Table:
    """An ``embedding_bag`` table: rows as stored (fp32 / bf16, or int8 codes) and int8 scales."""

    table: torch.Tensor
    scales: torch.Tensor | None  # fp32 [V] for int8 codes
    out_bf16: bool


def prepare_embedding_bag(weight: torch.Tensor | QuantizedWeight) -> Table:
    if isinstance(weight, QuantizedWeight):
        v, d = weight.shape
        if weight.format != "int8" or weight.scales is None or weight.scales.shape != (v, 1):
            raise ValueError(
                f"pace-avx512 embedding_bag takes int8 tables with one scale per row "
                f"(group_size {d}), not {weight.format} / group_size {weight.group_size}"
            )
        scales = weight.scales.float().reshape(v).contiguous()
        return Table(weight.data.contiguous(), scales, weight.dtype == torch.bfloat16)
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"pace-avx512 embedding_bag takes fp32 or bf16 tables, not {weight.dtype}")
    return Table(weight.contiguous(), None, weight.dtype == torch.bfloat16)


def embedding_bag(indices: torch.Tensor, offsets: torch.Tensor, w: Table) -> torch.Tensor:
    return (_E or _ext()).embedding_bag(indices, offsets, w.table, w.scales, w.out_bf16)


@dataclass(frozen=True)
class CrossStack:
    """The cross layers' packed ``V`` and ``U`` (one format for all), ``U``'s biases."""

    vs: tuple[torch.Tensor, ...]
    us: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    rank: int
    kind: int  # -1: dense packs; else the quantized kind (qpacking.KINDS)
    int8_act: bool  # quantized: int8 activations (W8A8) rather than 15-bit
    act_scales: tuple[torch.Tensor, ...] = ()  # static: V's and U's input scales per layer


def prepare_cross_interaction(layers: Sequence[tuple[Any, Any, torch.Tensor]]) -> CrossStack:
    vs, us, biases, kinds, act8, fixed = [], [], [], set(), set(), []
    rank = int(layers[0][0].shape[0]) if layers else 0
    for v, u, b in layers:
        if isinstance(v, QuantizedWeight) != isinstance(u, QuantizedWeight):
            raise ValueError("pace-avx512 cross_interaction needs V and U in one format")
        pv, pu = packing.prepare_linear(v), packing.prepare_linear(u, b)
        if isinstance(pv, qpacking.QPackedLinear):
            kinds.add((pv.kind, pu.kind))
            act8.update((pv.int8_activations, pu.int8_activations))
            fixed += [pv.act_scales, pu.act_scales]
            vs.append(pv.weight)
            us.append(pu.weight)
            biases.append(pu.bias)
        else:
            kinds.add((-1, -1))
            vs.append(pv.weight)
            us.append(pu.weight)
            biases.append(pu.bias)
    if len(kinds) > 1 or len(act8) > 1 or any(a != b for a, b in kinds):
        raise ValueError("pace-avx512 cross_interaction needs every layer in one weight format")
    if any(f is None for f in fixed) and any(f is not None for f in fixed):
        raise ValueError("pace-avx512 cross_interaction: static activation scales for every "
                         "layer's V and U or for none")  # fmt: skip
    kind = next(iter(kinds))[0] if kinds else -1
    scales = tuple(f for f in fixed if f is not None)
    return CrossStack(tuple(vs), tuple(us), tuple(biases), rank, kind, bool(act8 and act8.pop()),
                      scales)  # fmt: skip


def cross_interaction(x0: torch.Tensor, w: CrossStack) -> torch.Tensor:
    return (_E or _ext()).cross_stack(x0, w.vs, w.us, w.biases, w.rank, w.kind, w.int8_act,
                                      list(w.act_scales))  # fmt: skip


def supports(ctx: OpContext, quantized_problem: Any) -> bool | str:
    """The shapes and formats these kernels take (``quantized_problem(ctx, fmt)``: the
    plugin's VNNI check), then whether the extension builds."""
    fmt = ctx.attrs.get("weight_format") or "dense"
    if ctx.op == "embedding_bag":
        if fmt not in ("dense", "int8"):
            return f"weight format {fmt} unsupported (dense or int8 tables)"
        return build.available()
    d, r = ctx.attrs.get("in_features"), ctx.attrs.get("rank")
    if fmt != "dense":
        if "+" in fmt:
            return f"mixed weight formats {fmt} (one format for every cross layer)"
        if (why := quantized_problem(ctx, fmt)) is not None:
            return why
        for name, k in (("rank", r), ("in_features", d)):
            if k is not None and k % qpacking.GROUP:
                return f"{name} {k} is not a multiple of {qpacking.GROUP} (quantized packs)"
    elif ctx.dtype == torch.bfloat16 and any(k is not None and k % 2 for k in (d, r)):
        return "bf16 needs an even in_features and rank"
    return build.available()
