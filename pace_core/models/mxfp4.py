"""MXFP4 (OCP microscaling FP4) de-quantization, as stored in GPT-OSS checkpoints."""

from __future__ import annotations

import torch

# E2M1 code points: sign bit, 2 exponent bits, 1 mantissa bit.
FP4_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``blocks [E, R, G, 16]`` uint8 (two FP4 per byte, low nibble first) and ``scales [E, R, G]``
    (exponent + 127) → ``[E, G*32, R]``: the transposed layout GPT-OSS experts multiply with."""
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}"
        )
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    blocks = blocks.to(torch.uint8)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1)
    values = values.flatten(-2)  # [E, R, G, 32]
    values = torch.ldexp(values, (scales.to(torch.int32) - 127).unsqueeze(-1).float())
    return values.flatten(-2).transpose(1, 2).contiguous().to(dtype)
