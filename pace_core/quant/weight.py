"""A weight kept in a quantized format: what the resolver, the loader and kernels pass around.

A :class:`QuantizedWeight` is a ``[N, K]`` matrix (rows are output features, as in
``torch.nn.Linear``) stored in one of :data:`QUANTIZED_FORMATS`: pace's own ``int8`` (per-channel
or per-group symmetric) and ``int4`` (per-group, symmetric or with mins), or a GGUF block type
kept exactly as the file stores it. It never turns into a full-size float copy by itself:
:meth:`QuantizedWeight.dequantize` works on the rows asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from pace_core.quant import gguf_blocks

DENSE = "dense"
"""The format of an ordinary float tensor weight (the model's dtype)."""

PACE_FORMATS: tuple[str, ...] = ("int8", "int4")
GGUF_FORMATS: tuple[str, ...] = tuple(
    name for name, bt in gguf_blocks.BLOCK_TYPES.items() if bt.block_elems > 1
)
QUANTIZED_FORMATS: tuple[str, ...] = PACE_FORMATS + GGUF_FORMATS
WEIGHT_FORMATS: tuple[str, ...] = (DENSE, *QUANTIZED_FORMATS)
"""Every weight format a kernel may declare (``Registrations.add_kernel(weight_formats=...)``)."""

ACTIVATION_MODES: tuple[str, ...] = ("", "int8")
"""Values of :attr:`QuantizedWeight.activations`: the backend's choice, or W8A8."""

Rows = slice | torch.Tensor | None


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A ``[N, K]`` matrix in a quantized ``format`` that de-quantizes to ``dtype``.

    Storage by format (every tensor has ``N`` rows):

    - ``int8``: ``data`` int8 ``[N, K]``; ``scales`` fp16 ``[N, K // group_size]``;
      ``w = q * s``.
    - ``int4``: ``data`` uint8 ``[N, K // 2]`` (element ``2j`` in the low nibble, ``2j + 1`` in
      the high one); ``scales`` fp16 ``[N, K // group_size]``; symmetric ``w = (q - 8) * s``,
      or with ``mins`` fp16 (same shape) ``w = q * s + m``.
    - a GGUF block type (``q4_k``, ...): ``data`` uint8 ``[N, row_bytes]``, the file's blocks.

    ``activations``: how a matmul kernel takes its activations against this weight. ``""``
    (the default): as the backend chooses (pace-avx512: ``PACE_QUANT_ACTIVATIONS``).
    ``"int8"``: W8A8, every activation row quantized to int8 when the kernel runs, with a
    dynamic scale per row and group of :attr:`activation_group` values (``amax / 127``, round
    to nearest even), in fp32 models too (DLRMv2's int8 scheme, :mod:`pace_core.dlrm.quantize`).
    ``activation_scales``: with ``"int8"``, static (calibrated) scales instead of dynamic
    ones: fp32 ``[K // 32]``, one per 32 input values shared by every row, codes clamped to
    +-127.
    """

    format: str
    shape: tuple[int, int]
    dtype: torch.dtype
    data: torch.Tensor
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None
    group_size: int = 0
    activations: str = ""
    activation_scales: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.format not in QUANTIZED_FORMATS:
            raise ValueError(
                f"unknown weight format {self.format!r}; known: {', '.join(QUANTIZED_FORMATS)}"
            )
        if self.data.shape[0] != self.shape[0]:
            raise ValueError(f"data has {self.data.shape[0]} rows, shape says {self.shape[0]}")
        if self.activations not in ACTIVATION_MODES:
            raise ValueError(f"unknown activations {self.activations!r}; known: {ACTIVATION_MODES}")
        scales = self.activation_scales
        if scales is not None and (
            self.activations != "int8" or scales.shape != (self.shape[1] // 32,)
        ):
            raise ValueError(
                f"static activation scales need activations 'int8' and shape "
                f"[{self.shape[1] // 32}] (one per 32 inputs), got {tuple(scales.shape)}"
            )

    @property
    def activation_group(self) -> int:
        """Input values per dynamic int8 activation scale of a W8A8 weight: 64 against int8
        weights with one scale per row and K a multiple of 64 (an integer GEMM then flushes
        its int32 sums half as often: ~10% faster, pace-avx512's csrc/igemm.cpp), else 32."""
        per_row = self.format == "int8" and self.group_size == self.shape[1]
        return 64 if per_row and self.shape[1] % 64 == 0 else 32

    @property
    def nbytes(self) -> int:
        """Bytes of storage (codes, scales and mins)."""
        parts = (self.data, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / (self.shape[0] * self.shape[1])

    def dequantize(self, rows: Rows = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The float values of ``rows`` (all by default): ``[len(rows), K]`` in ``dtype``."""
        part = self if rows is None else self.rows(rows)
        return _dequantize(part).to(dtype or self.dtype)

    def rows(self, index: slice | torch.Tensor) -> QuantizedWeight:
        """The weight restricted to the output rows ``index`` (a slice or index tensor)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        data = self.data[index]
        return replace(
            self,
            shape=(int(data.shape[0]), self.shape[1]),
            data=data,
            scales=pick(self.scales),
            mins=pick(self.mins),
        )

    def split(self, sizes: Sequence[int]) -> list[QuantizedWeight]:
        """Consecutive row blocks of the given ``sizes`` (as ``torch.split`` on dim 0)."""
        out, start = [], 0
        for size in sizes:
            out.append(self.rows(slice(start, start + size)))
            start += size
        if start != self.shape[0]:
            raise ValueError(f"split sizes {list(sizes)} do not add up to {self.shape[0]} rows")
        return out

    def with_dtype(self, dtype: torch.dtype) -> QuantizedWeight:
        return replace(self, dtype=dtype)

    @staticmethod
    def cat(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """Stack row blocks of one format (and group size) into one weight."""
        first = parts[0]
        for p in parts[1:]:
            if (p.format, p.group_size, p.shape[1]) != (first.format, first.group_size,
                                                        first.shape[1]):  # fmt: skip
                raise ValueError(
                    f"cannot stack a {p.format} [*, {p.shape[1]}] (group {p.group_size}) weight "
                    f"onto a {first.format} [*, {first.shape[1]}] (group {first.group_size}) one"
                )

        def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
            return None if ts[0] is None else torch.cat(ts)  # type: ignore[arg-type]

        return replace(
            first,
            shape=(sum(p.shape[0] for p in parts), first.shape[1]),
            data=torch.cat([p.data for p in parts]),
            scales=cat([p.scales for p in parts]),
            mins=cat([p.mins for p in parts]),
        )


def weight_format(weight: object) -> str:
    """The format name of a weight: a :class:`QuantizedWeight`'s, else :data:`DENSE`."""
    return weight.format if isinstance(weight, QuantizedWeight) else DENSE


def formats_of(weights: Sequence[object]) -> str:
    """The format of several weights of one op: one name, or the distinct ones joined by '+'."""
    return "+".join(sorted({weight_format(w) for w in weights}))


def _dequantize(w: QuantizedWeight) -> torch.Tensor:
    n, k = w.shape
    if w.format == "int8":
        groups = w.data.view(n, -1, w.group_size).float()
        return (groups * w.scales.float().unsqueeze(-1)).view(n, k)
    if w.format == "int4":
        codes = torch.stack((w.data & 0x0F, w.data >> 4), dim=-1).view(n, -1, w.group_size)
        scales = w.scales.float().unsqueeze(-1)
        if w.mins is None:
            return ((codes.float() - 8.0) * scales).view(n, k)
        return (codes.float() * scales + w.mins.float().unsqueeze(-1)).view(n, k)
    return gguf_blocks.block_type(w.format).dequantize(w.data)
