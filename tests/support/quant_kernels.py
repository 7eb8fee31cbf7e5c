"""The quantized-kernel tests' weights and exact models (tests/avx512): pace presets and GGUF
blocks as ``QuantizedWeight``, what the kernels compute in float64, what the folded int8
kernels and the k-quants' int8 super-block tiles compute bit for bit, the bf16 panel's switch
and the int8 tiles' width."""

from __future__ import annotations

import contextlib

import torch
from pace_avx512 import qpacking

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


def activation_span(kind: int, path: str) -> int:
    """k per activation scale of a ``qlinear`` call on ``path`` (``qpacking.qlinear_path``):
    256 for kinds q4k and q6 on int8 activations (their tiles are integer per super-block:
    csrc/q4k_tile.h, csrc/q6k_tile.h), else 32."""
    super_kinds = (qpacking.KINDS["q4k"], qpacking.KINDS["q6"])
    return 256 if path == "int8" and kind in super_kinds else 32


def quantized_rows(
    x: torch.Tensor, levels: float, span: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """x's activation codes ``[m, k / 32, 32]`` and fp32 scales ``[m, k / 32, 1]`` per group of
    32 as the VNNI kernels quantize them (fp32 steps, round half to even), one scale per
    ``span`` k (repeated for each of its groups)."""
    m, k = x.shape
    amax = x.float().view(m, k // span, span).abs().amax(-1, keepdim=True)
    amax = amax.repeat_interleave(span // 32, dim=1)
    inv = torch.where(amax > 0, torch.tensor(levels) / amax, torch.zeros_like(amax))
    return torch.round(x.float().view(m, k // 32, 32) * inv), amax / levels


def reference(x: torch.Tensor, w: torch.Tensor, path: str, span: int = 32) -> torch.Tensor:
    """``x @ w.T`` as ``path`` (``qpacking.qlinear_path``) computes it, summed in float64: x
    quantized per group of 32 (a scale per ``span``: :func:`activation_span`) as the VNNI
    kernel does (fp32 steps), or, on the bf16 panel, the weights rounded to bf16 and x as it
    is."""
    if path == "bf16-panel":
        return (x.double() @ w.bfloat16().double().T).float()
    codes, scales = quantized_rows(x, 127.0 if path == "int8" else 16256.0, span)
    xq = codes * scales  # the codes times the fp32 scale
    return (xq.view(x.shape).double() @ w.double().T).float()


def signed_codes(q: QuantizedWeight, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight of a kind without mins (its min -offset s) as the packing reads it: signed
    codes ``[n, k]`` and fp32 scales (fp16 values) ``[n, spans]``, one per 32 k (16: q6_k
    packed as int8-g16)."""
    codes, tables = qpacking._codes_tables(q, slice(None), kind)
    assert len(tables) == 1, "a kind with mins"
    if codes.dtype == torch.uint8:  # 4-bit, symmetric: (u - 8) s
        codes = codes.to(torch.int16) - 8
    return codes, tables[0].half().float()


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a * b + c`` rounded once (as vfmadd): ``a`` integers below 2^29 (float64), ``b``
    and ``c`` fp32. The product is exact in float64; the sum is float64 plus its exact error
    (TwoSum), which decides the fp32 rounding where the float64 sum is an fp32 tie."""
    p, c = a * b.double(), c.double()
    t = p + c
    back = t - p
    err = (p - (t - back)) + (c - back)
    r = t.float()
    mirror = 2 * t - r.double()  # a tie's other fp32 neighbour
    tie = (r.double() != t) & (mirror.float().double() == mirror)
    return torch.where(tie & ((mirror - t) * err > 0), mirror.float(), r)


def folded(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` (fp32, before the bias) bit for bit as the int8-activation kernels compute
    it for a kind without mins (``w = q s``: the fold, qlinear.cpp): per scale span of 16 or
    32 k in order, ``total = fma(sum q xq, s * xs, total)`` in fp32, the integer sum exact."""
    m, k = x.shape
    n, spans = scales.shape
    xq, xs = quantized_rows(x, 127.0)
    xq = xq.double().view(m, spans, k // spans)
    sums = torch.einsum("msj,nsj->mns", xq, codes.double().view(n, spans, k // spans))
    sx = scales * xs.view(m, 1, -1).repeat_interleave(spans * 32 // k, dim=2)  # fp32 [m, n, spans]
    total = torch.zeros(m, n)
    for span in range(spans):
        total = fma32(sums[..., span], sx[..., span], total)
    return total


def q4k_super(x: torch.Tensor, q: QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` (fp32, before the bias) bit for bit as the int8-activation kernels compute
    it for a q4_k weight ``q`` (kind q4k, csrc/q4k_tile.h): x quantized per 256, and per
    super-block in order ``total = fma(float(acc), d * xs, total)``, then ``total =
    fma(msum, -dmin * xs, total)``, with the integer sums ``acc = sum sc_i (sum u xq)_i`` and
    ``msum = sum m_i (sum xq)_i`` over its sub-blocks i of 32 exact (float(acc): fp32 round to
    nearest even), ``d * xs`` and ``-dmin * xs`` fp32 products."""
    codes, (d, dmin, sc, mn) = qpacking._codes_tables(q, slice(None), qpacking.KINDS["q4k"])
    m, k = x.shape
    n, groups, supers = codes.shape[0], k // 32, k // 256
    xq, xs = quantized_rows(x, 127.0, 256)  # [m, groups, 32], [m, groups, 1]
    xq = xq.double()
    isum = torch.einsum("mgj,ngj->mng", xq, codes.double().view(n, groups, 32))
    acc = (isum * sc.double()).view(m, n, supers, 8).sum(-1)  # [m, n, supers]
    msum = (xq.sum(-1).unsqueeze(1) * mn.double()).view(m, n, supers, 8).sum(-1)
    xs = xs.view(m, 1, supers, 8)[..., 0]  # the scale per 256, fp32
    dx, mx = d.float() * xs, -dmin.float() * xs  # fp32 [m, n, supers]
    total = torch.zeros(m, n)
    for s in range(supers):
        total = fma32(acc[..., s].float().double(), dx[..., s], total)
        total = fma32(msum[..., s], mx[..., s], total)
    return total


def q6k_super(x: torch.Tensor, q: QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` (fp32, before the bias) bit for bit as the int8-activation kernels compute
    it for a q6_k weight ``q`` (kind q6, csrc/q6k_tile.h): x quantized per 256, and per
    super-block in order ``total = fma(float(acc), d * xs, total)`` with the integer sum
    ``acc = sum sc_i (sum q xq)_i`` over its 16 sub-blocks i of 16 k exact (float(acc): fp32
    round to nearest even) and ``d * xs`` an fp32 product."""
    codes, (d, sc, _) = qpacking._codes_tables(q, slice(None), qpacking.KINDS["q6"])
    m, k = x.shape
    n, subs, supers = codes.shape[0], k // 16, k // 256
    xq, xs = quantized_rows(x, 127.0, 256)  # [m, groups, 32], [m, groups, 1]
    isum = torch.einsum("msj,nsj->mns", xq.double().view(m, subs, 16),
                        codes.double().view(n, subs, 16))  # fmt: skip
    acc = (isum * sc.double()).view(m, n, supers, 16).sum(-1)  # [m, n, supers]
    dx = d.float() * xs.view(m, 1, supers, 8)[..., 0]  # fp32 [m, n, supers]
    total = torch.zeros(m, n)
    for s in range(supers):
        total = fma32(acc[..., s].float().double(), dx[..., s], total)
    return total


@contextlib.contextmanager
def tuned(ext, knob: str, value: int):
    """pace-avx512's tuning knob ``knob`` set to ``value`` (``ext.set_<knob>``), restored
    after."""
    before = getattr(ext, knob)()
    getattr(ext, f"set_{knob}")(value)
    try:
        yield
    finally:
        getattr(ext, f"set_{knob}")(before)


@contextlib.contextmanager
def panel_rows(ext, rows: int):
    """The bf16 panel path from ``rows`` rows for every kind (0: never), restored after."""
    with tuned(ext, "qpanel_rows", rows), tuned(ext, "qpanel_every_kind", rows > 0):
        yield


def tile_blocks(ext, blocks: int):
    """Tiles of ``blocks`` row blocks side by side on int8 activations (0: each kind's own),
    restored after."""
    return tuned(ext, "qtile_blocks", blocks)
