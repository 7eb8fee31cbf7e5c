"""Weight packing: the ``prepare`` half of the prepared ops, run once at model build.

Layouts (see ``csrc/kernels.h``, whose ``BLOCK`` and ``GROUP`` the extension exports and
:func:`layout` reads), in groups of 64 output columns (4 blocks of 16), zero padded, each
group one contiguous run:

- bf16 ``[NG, Kp/2, 128]``: element ``[g, p, 32i + 2j + e] = W[64g + 16i + j, 2p + e]``
  (Kp = K rounded up to even): each 64-byte line is the k-pair operand of one ``vdpbf16ps``
  for the 16 columns of block ``i``;
- fp32 ``[NG, K, 64]``: element ``[g, k, 16i + j] = W[64g + 16i + j, k]``.

A thread reads its groups front to back: one sequential stream, which the hardware
prefetcher follows without restarts. Biases become fp32 padded to ``NG*64`` (the kernels add
them in fp32 before rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pace_avx512 import build, qpacking
from pace_avx512.qpacking import QPackedGatedMLP, QPackedLinear, QPackedQKV
from pace_core.ops import ACTIVATIONS
from pace_core.quant import QuantizedWeight


def layout() -> tuple[int, int]:
    """``(block, columns)``: columns per vector of accumulators and per packed group."""
    ext = build.load_extension()
    return ext.BLOCK, ext.BLOCK * ext.GROUP


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` -> the grouped layout of its dtype (bf16 VNNI pairs or fp32)."""
    grouped, shape = _grouped(weight)
    return grouped.contiguous().view(shape)


def _grouped(weight: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A view of ``weight`` in packed element order and the packed shape it is stored as."""
    if weight.dim() != 2:
        raise ValueError(f"pace-avx512 packs 2-D weights, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    _, columns = layout()
    ng = -(-n // columns)
    if weight.dtype == torch.bfloat16:
        kp = k + k % 2
        w = _padded(weight, kp - k, ng * columns - n)
        grouped = w.view(ng, columns, kp // 2, 2).permute(0, 2, 1, 3)
        return grouped, (ng, kp // 2, 2 * columns)
    if weight.dtype == torch.float32:
        w = _padded(weight, 0, ng * columns - n)
        return w.view(ng, columns, k).permute(0, 2, 1), (ng, k, columns)
    raise TypeError(f"pace-avx512 kernels take float32 or bfloat16 weights, got {weight.dtype}")


def _padded(weight: torch.Tensor, cols: int, rows: int) -> torch.Tensor:
    """``weight`` zero-padded by ``cols`` columns and ``rows`` rows (itself when neither: a
    large table is not copied once more than packing needs)."""
    return F.pad(weight, (0, cols, 0, rows)) if cols or rows else weight


def resident(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` packed straight into huge-page backed memory (see ``huge_page_copy`` in
    ``csrc/bindings.cpp``): one copy, no packed intermediate."""
    grouped, shape = _grouped(weight)
    return build.load_extension().huge_page_copy(grouped, list(shape))


def pack_bias(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    if bias is None:
        return None
    _, columns = layout()
    ng = -(-n // columns)
    return F.pad(bias.reshape(-1).float(), (0, ng * columns - n)).contiguous()


def interleave_blocks(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows ``g[0:16], u[0:16], g[16:32], u[16:32], ...`` (I padded to a multiple of 16)."""
    inter, k = gate.shape
    block, _ = layout()
    nb = -(-inter // block)
    g, u = (F.pad(t, (0, 0, 0, nb * block - inter)).view(nb, block, k) for t in (gate, up))
    return torch.stack([g, u], dim=1).reshape(2 * nb * block, k)


@dataclass(frozen=True)
class PackedLinear:
    weight: torch.Tensor  # packed, see module doc
    bias: torch.Tensor | None  # fp32 [NB*16]
    out_features: int
    in_features: int

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the unpacked ``[N, K]`` matrix (a tied embedding's lookup reads the
        head's packed copy, so the model keeps one copy of the table)."""
        return build.load_extension().packed_rows(self.weight, ids, self.in_features)


@dataclass(frozen=True)
class PackedQKV:
    linear: PackedLinear  # [wq; wk; wv] packed as one matrix
    sizes: tuple[int, int, int]


@dataclass(frozen=True)
class PackedGatedMLP:
    gate_up: torch.Tensor  # blocks g0, u0, g1, u1, ... of the packed gate and up
    down: torch.Tensor  # packed [hidden, intermediate]
    activation: int  # code: the index of its name in the extension's ACTIVATIONS
    intermediate: int
    hidden: int


def prepare_linear(weight, bias: torch.Tensor | None = None) -> PackedLinear | QPackedLinear:
    if isinstance(weight, QuantizedWeight):
        return qpacking.prepare_linear(weight, bias)
    n, k = weight.shape
    return PackedLinear(resident(weight), pack_bias(bias, n), int(n), int(k))


def prepare_qkv(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None = None
) -> PackedQKV | QPackedQKV:
    if isinstance(weights[0], QuantizedWeight):
        return qpacking.prepare_qkv(weights, biases)  # type: ignore[arg-type]
    sizes = tuple(int(w.shape[0]) for w in weights)
    bias = torch.cat([b.reshape(-1) for b in biases]) if biases is not None else None
    return PackedQKV(prepare_linear(torch.cat(list(weights)), bias), sizes)  # type: ignore[arg-type]


def prepare_gated_mlp(
    gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, activation: str
) -> PackedGatedMLP | QPackedGatedMLP:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if isinstance(gate, QuantizedWeight):
        return qpacking.prepare_gated_mlp(gate, up, down, activation)  # type: ignore[arg-type]
    if gate.shape != up.shape or down.shape != gate.shape[::-1]:
        raise ValueError(
            f"gated MLP shapes disagree: gate {tuple(gate.shape)}, up {tuple(up.shape)}, "
            f"down {tuple(down.shape)}"
        )
    gate_up = resident(interleave_blocks(gate, up))
    inter, hidden = gate.shape
    down_packed = resident(down)
    code = build.load_extension().ACTIVATIONS.index(activation)
    return PackedGatedMLP(gate_up, down_packed, code, int(inter), int(hidden))


@dataclass(frozen=True)
class ClampedExpert:
    """A GPT-OSS expert: gate/up (rows interleaved) and down as packed linears with biases."""

    gate_up: PackedLinear | QPackedLinear
    down: PackedLinear | QPackedLinear


@dataclass(frozen=True)
class PackedExperts:
    """Op ``moe``'s experts: packed gated MLPs, or for GPT-OSS's clamped SwiGLU (``clamped``)
    packed linears whose activation runs between them."""

    experts: tuple[PackedGatedMLP | QPackedGatedMLP | ClampedExpert, ...]
    clamped: bool = False
    alpha: float = 1.0
    limit: float = 0.0


def _expert_matrices(gate_up, down, e: int) -> tuple[Any, Any]:
    """Expert ``e``'s ``[2I, H]`` (gate/up rows interleaved) and ``[H, I]`` matrices, from the
    stacked ``[E, H, 2I]`` / ``[E, I, H]`` tensors or the per-expert lists."""
    if isinstance(gate_up, torch.Tensor):
        return gate_up[e].t(), down[e].t()
    return gate_up[e], down[e]


def prepare_moe(
    gate_up: torch.Tensor | Sequence[Any],
    gate_up_bias: torch.Tensor | None,
    down: torch.Tensor | Sequence[Any],
    down_bias: torch.Tensor | None,
    alpha: float,
    limit: float,
    activation: str,
) -> PackedExperts:
    """``gate_up [E, H, 2I]`` (gate and up interleaved) and ``down [E, I, H]``, or per expert
    ``[2I, H]`` and ``[H, I]`` matrices in any format -> one packed gated MLP per expert, or
    for ``swiglu_oai`` two packed linears with their biases per expert."""
    if activation == "swiglu_oai":
        experts = []
        for e in range(len(gate_up)):
            gu, dn = _expert_matrices(gate_up, down, e)
            experts.append(ClampedExpert(
                prepare_linear(gu, None if gate_up_bias is None else gate_up_bias[e]),
                prepare_linear(dn, None if down_bias is None else down_bias[e]),
            ))  # fmt: skip
        return PackedExperts(tuple(experts), True, float(alpha), float(limit))
    if gate_up_bias is not None or down_bias is not None or activation not in ACTIVATIONS:
        raise ValueError(f"pace-avx512 experts with biases need activation 'swiglu_oai'; "
                         f"got {activation!r}")  # fmt: skip
    packed = []
    for e in range(len(gate_up)):
        gu, dn = _expert_matrices(gate_up, down, e)
        pick = gu.__getitem__ if isinstance(gu, torch.Tensor) else gu.rows
        gate, up = pick(slice(0, None, 2)), pick(slice(1, None, 2))
        packed.append(prepare_gated_mlp(gate, up, dn, activation))
    return PackedExperts(tuple(packed))
