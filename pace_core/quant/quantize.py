"""Quantize a float matrix into pace's own formats (``int8``, ``int4``), one tensor at a time."""

from __future__ import annotations

import torch

from pace_core.errors import ConfigError
from pace_core.quant.config import QuantizationConfig
from pace_core.quant.weight import QuantizedWeight

CHUNK_ELEMENTS = 1 << 21  # rows quantized at a time: bounds the fp32 temporaries (~8 MB each)


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
"""(codes, scales, mins) of some rows; ``mins`` only for int4 with mins."""


def quantize(w: torch.Tensor, config: QuantizationConfig, *, name: str = "") -> QuantizedWeight:
    """``w`` ``[N, K]`` (float) in the format of ``config``; de-quantizes to ``w.dtype``.

    Round-to-nearest with absmax scales (int8, symmetric int4) or min/max scales (int4 with
    mins), computed in fp32 per group; scales are stored as fp16 and the codes are computed
    from the rounded scales, so de-quantization reproduces exactly what was chosen.
    """
    if w.dim() != 2:
        what = name or "a tensor"
        raise ConfigError(f"cannot quantize {what} of shape {tuple(w.shape)}: not 2-D")
    n, k = w.shape
    group = config.group_size or k
    if k % group or (config.bits == 4 and k % 2):
        raise ConfigError(
            f"cannot quantize {name or 'a weight'} [{n}, {k}] with group_size {group}: the row "
            f"length {k} is not a multiple of it; choose a group size dividing {k} or skip it "
            f"(QuantizationConfig(skip=[{name.rsplit('.', 1)[0]!r}]))"
        )
    rows = max(1, CHUNK_ELEMENTS // k)
    parts = _quantize_rows(w, config, group) if n <= rows else _in_chunks(w, config, group, rows)
    return QuantizedWeight(config.format, (n, k), w.dtype, *parts, group, config.activations)


def _in_chunks(w: torch.Tensor, config: QuantizationConfig, group: int, rows: int) -> Parts:
    """:func:`_quantize_rows` ``rows`` at a time, into one set of outputs (no concatenation)."""
    whole: list[torch.Tensor | None] = []
    for start in range(0, w.shape[0], rows):
        part = _quantize_rows(w[start : start + rows], config, group)
        if not whole:
            whole = [None if t is None else t.new_empty((w.shape[0], *t.shape[1:])) for t in part]
        for out, t in zip(whole, part, strict=True):
            if out is not None:
                out[start : start + t.shape[0]] = t
    return whole[0], whole[1], whole[2]


def _quantize_rows(w: torch.Tensor, config: QuantizationConfig, group: int) -> Parts:
    """Codes, scales and mins of the rows of ``w`` (stored as :class:`QuantizedWeight` does)."""
    n, k = w.shape
    groups = w.detach().float().reshape(n, k // group, group)
    if config.bits == 8:
        scales = _fp16(groups.abs().amax(-1) / 127.0)
        codes = _divide(groups, scales).round().clamp(-127, 127).to(torch.int8)
        return codes.view(n, k), scales, None
    if config.symmetric:
        # the code range is [-8, 7]: map the group's largest magnitude (with its sign) to -8
        # as llama.cpp's Q4_0 does, which uses all 16 levels
        idx = groups.abs().argmax(-1, keepdim=True)
        scales = _fp16(groups.gather(-1, idx).squeeze(-1) / -8.0)
        codes = (_divide(groups, scales).round() + 8).clamp(0, 15)
        mins = None
    else:
        scales, mins, codes = _affine_int4(groups)
    codes = codes.to(torch.uint8).view(n, k // 2, 2)
    return codes[..., 0] | (codes[..., 1] << 4), scales, mins


SPANS = range(15, 7, -1)  # candidate numbers of steps between a group's min and max


def _affine_int4(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scales, mins and codes of ``w = q * s + m`` per group, the scale chosen among
    ``(max - min) / j`` for j in :data:`SPANS` by least squared error (the min anchored at the
    group's min; values beyond ``min + 15 s`` clip). j = 15 is plain min/max rounding; smaller
    spans trade clipping for finer steps, and recover exactly a group that already lies on a
    coarser 16-level grid (a checkpoint de-quantized from Q4_K, say) that min/max misses."""
    lo, hi = groups.amin(-1), groups.amax(-1)
    mins = _fp16(lo)
    best = None
    for span in SPANS:
        scales = _fp16((hi - lo) / span)
        codes = _divide(groups - mins.float().unsqueeze(-1), scales).round().clamp(0, 15)
        error = (codes * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1) - groups)
        error = error.square().sum(-1)
        if best is None:
            best = (error, scales, codes)
            continue
        better = error < best[0]
        best = (
            torch.where(better, error, best[0]),
            torch.where(better, scales, best[1]),
            torch.where(better.unsqueeze(-1), codes, best[2]),
        )
    return best[1], mins, best[2]


def _fp16(scales: torch.Tensor) -> torch.Tensor:
    return scales.to(torch.float16)


def _divide(groups: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``groups / scale`` per group, 0 where the scale is 0 (an all-zero group)."""
    s = scales.float().unsqueeze(-1)
    return torch.where(s == 0, torch.zeros_like(groups), groups / torch.where(s == 0, 1.0, s))
