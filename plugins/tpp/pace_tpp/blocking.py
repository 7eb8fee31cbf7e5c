"""Block sizes (``PACE_TPP_BN``/``BK``/``BM``) and the one-time re-blocking of weights.

A weight ``[N, K]`` is zero-padded to multiples of the blocks and stored panel by panel:
fp32 ``[N/bn][K/bk][bk][bn]``; bf16 in VNNI-2 pairs ``[N/bn][K/bk][bk/2][bn][2]``, the A
operand layout of libxsmm's bf16 BRGEMM (``LIBXSMM_GEMM_FLAG_VNNI_A``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Measured on an AMD EPYC with AVX512-BF16 (2 cores): bn=32 streams cold weights best at M=1..8
# (libxsmm's fp32 m=64, n=1 kernel is ~2x slower) and stays within ~10% at M=128; bk
# makes each A block one 4 KiB page (bf16 64x32x2 B, fp32 32x32x4 B).
DEFAULT_BN, DEFAULT_BM = 32, 64
DEFAULT_BK = {torch.bfloat16: 64, torch.float32: 32}


@dataclass(frozen=True)
class Blocks:
    """Block sizes of one weight: N (output) block, K (reduction) block, M (rows) block."""

    bn: int
    bk: int
    bm: int


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer (got {text!r})") from None
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer (got {value})")
    return value


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def choose_blocks(n: int, k: int, dtype: torch.dtype) -> Blocks:
    """Blocks for an ``[n, k]`` weight: the env/default sizes, shrunk for small matrices."""
    bn = _env_int("PACE_TPP_BN", DEFAULT_BN)
    bk = _round_up(_env_int("PACE_TPP_BK", DEFAULT_BK.get(dtype, 32)), 2)  # VNNI-2: even bk
    bm = _env_int("PACE_TPP_BM", DEFAULT_BM)
    return Blocks(min(bn, _round_up(n, 16)), min(bk, _round_up(k, 16)), bm)


def pack(weight: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Re-block ``weight [N, K]`` into BRGEMM A panels (a new contiguous tensor)."""
    n, k = weight.shape
    bn, bk = blocks.bn, blocks.bk
    np_, kp = _round_up(n, bn), _round_up(k, bk)
    w = torch.nn.functional.pad(weight, (0, kp - k, 0, np_ - n))
    if weight.dtype == torch.bfloat16:
        w = w.view(np_ // bn, bn, kp // bk, bk // 2, 2).permute(0, 2, 3, 1, 4)
    else:
        w = w.view(np_ // bn, bn, kp // bk, bk).permute(0, 2, 3, 1)
    return w.contiguous()


def pack_pair(first: torch.Tensor, second: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Two same-shape weights packed panel-interleaved: ``[N/bn][2][K/bk][...]``."""
    return torch.stack([pack(first, blocks), pack(second, blocks)], dim=1).contiguous()
