"""The quantized-kernel tests' weights and exact model (tests/avx512): pace presets and GGUF
blocks as ``QuantizedWeight``, what the kernels compute in float64, the bf16 panel's switch."""

from __future__ import annotations

import contextlib

import torch

from pace_core.quant import QuantizationConfig, QuantizedWeight, quantize
from support.tiny_gguf import quantize as gguf_quantize

PACE = {
    "int8-g32": QuantizationConfig(bits=8, group_size=32),
    "int8-channel": QuantizationConfig(bits=8, group_size=0),
    "int8-g64": QuantizationConfig(bits=8, group_size=64),
    "int4-mins-g32": QuantizationConfig(bits=4, group_size=32, symmetric=False),
    "int4-sym-g128": QuantizationConfig(bits=4, group_size=128, symmetric=True),
}


def weight(kind: str, n: int, k: int) -> QuantizedWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    w[1] = 0.0  # an all-zero row (zero scales)
    if kind in PACE:
        return quantize(w, PACE[kind])
    data, _ = gguf_quantize(w, kind)
    return QuantizedWeight(kind, (n, k), torch.float32, torch.from_numpy(data).reshape(n, -1))


def reference(x: torch.Tensor, w: torch.Tensor, path: str) -> torch.Tensor:
    """``x @ w.T`` as ``path`` (``qpacking.qlinear_path``) computes it, summed in float64: x
    quantized per group of 32 as the VNNI kernel does (fp32 steps), or, on the bf16 panel, the
    weights rounded to bf16 and x as it is."""
    if path == "bf16-panel":
        return (x.double() @ w.bfloat16().double().T).float()
    levels = 127.0 if path == "int8" else 16383.0
    m, k = x.shape
    g = x.float().view(m, k // 32, 32)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(levels) / amax, torch.zeros_like(amax))
    xq = torch.round(g * inv) * (amax / levels)  # the codes times the fp32 scale
    return (xq.view(m, k).double() @ w.double().T).float()


@contextlib.contextmanager
def panel_rows(ext, rows: int):
    """The bf16 panel path from ``rows`` rows (0: never), restored after."""
    before = ext.qpanel_rows()
    ext.set_qpanel_rows(rows)
    try:
        yield
    finally:
        ext.set_qpanel_rows(before)
