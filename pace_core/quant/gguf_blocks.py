"""Vectorised pure-torch (de)quantization of GGUF/ggml tensor blocks.

Bit-exact against the numpy reference in the ``gguf`` package (``gguf.quants``): every
dequantizer performs the same float32 operations in the same order (no fused multiply-add),
so each element is the same IEEE value. Raw data is a ``uint8`` tensor whose last dim is a
whole number of blocks; all blocks of all rows are decoded at once, without Python loops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK_K = 256  # elements per k-quant super-block

__all__ = [
    "BLOCK_TYPES",
    "BY_GGML_TYPE",
    "K_QUANT_WRITERS",
    "BlockType",
    "block_type",
    "quantize_k",
    "quantize_q4_0",
    "quantize_q8_0",
]


@dataclass(frozen=True)
class BlockType:
    """One GGUF tensor type: its block geometry and a torch dequantizer."""

    name: str
    ggml_type: int
    block_elems: int
    block_bytes: int

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of ``k`` elements (``k`` must be a multiple of the block size)."""
        if k < 0 or k % self.block_elems:
            raise ValueError(
                f"{self.name}: row of {k} elements is not a multiple of the block size "
                f"{self.block_elems}"
            )
        return k // self.block_elems * self.block_bytes

    def dequantize(self, raw: torch.Tensor) -> torch.Tensor:
        """Decode raw ``uint8 [..., n * block_bytes]`` to ``float32 [..., n * block_elems]``.

        For ``f32`` the result may share memory with ``raw``.
        """
        if raw.dtype != torch.uint8:
            raise TypeError(f"{self.name}: raw data must be uint8, got {raw.dtype}")
        if raw.dim() == 0 or raw.shape[-1] % self.block_bytes:
            raise ValueError(
                f"{self.name}: last dim {tuple(raw.shape)[-1:]} is not a whole number of "
                f"{self.block_bytes}-byte blocks"
            )
        lead = raw.shape[:-1]
        n_blocks = raw.shape[-1] // self.block_bytes
        blocks = raw.reshape(-1, self.block_bytes)
        out = _DEQUANT[self.name](blocks)
        return out.reshape(*lead, n_blocks * self.block_elems)


# --------------------------------------------------------------------------- bit helpers


def _aligned(x: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``x`` contiguous with a storage offset allowing a ``view`` as a wider dtype."""
    x = x.contiguous()
    if x.storage_offset() % nbytes:
        x = x.clone()
    return x


def _f16(blocks: torch.Tensor, off: int) -> torch.Tensor:
    """The float16 field at byte ``off`` of every block, as float32 ``[N, 1]``."""
    return blocks[:, off : off + 2].contiguous().view(torch.float16).float()


def _shifts(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def unpack_blocks(x: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """``[N, G, L] -> [N, G, len(shifts), L]``: ``(x >> s) & mask`` for every shift ``s``."""
    s = _shifts(*shifts).view(1, 1, -1, 1)
    return (x.unsqueeze(-2) >> s) & mask


def nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Low then high nibbles of each run of ``group`` bytes: ``[N, B] -> [N, 2 * B]``."""
    n = qs.shape[0]
    return unpack_blocks(qs.reshape(n, -1, group), (0, 4), 0x0F).reshape(n, -1)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """Little-endian bits of a little-endian bit field: ``[N, B] -> [N, 8 * B]`` of 0/1."""
    n = qh.shape[0]
    return unpack_blocks(qh.reshape(n, -1, 1), tuple(range(8)), 1).reshape(n, -1)


# --------------------------------------------------------------------------- dequantizers


def _deq_f32(b: torch.Tensor) -> torch.Tensor:
    return _aligned(b, 4).view(torch.float32)


def _deq_f16(b: torch.Tensor) -> torch.Tensor:
    return _aligned(b, 2).view(torch.float16).float()


def _deq_bf16(b: torch.Tensor) -> torch.Tensor:
    return _aligned(b, 2).view(torch.bfloat16).float()


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    x = b[:, 2:].contiguous().view(torch.int8).float()
    return x * _f16(b, 0)


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 2:], 16).float() - 8.0
    return _f16(b, 0) * q


def _deq_q4_1(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 4:], 16).float()
    return _f16(b, 0) * q + _f16(b, 2)


def q5_values(b: torch.Tensor, qh_off: int) -> torch.Tensor:
    """The 5-bit values (0..31, uint8) of a q5_0/q5_1 block."""
    hi = _bits(b[:, qh_off : qh_off + 4])
    return nibbles(b[:, qh_off + 4 :], 16) | (hi << 4)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    q = q5_values(b, 2).float() - 16.0
    return _f16(b, 0) * q


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    q = q5_values(b, 4).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _deq_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    qs = b[:, 16:80].reshape(n, 2, 32)
    d, dmin = _f16(b, 80), _f16(b, 82)
    dl = (d * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    q = unpack_blocks(qs, (0, 2, 4, 6), 3).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _deq_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, :32].reshape(n, 1, 32)
    qs = b[:, 32:96].reshape(n, 2, 32)
    sc = b[:, 96:108]
    d = _f16(b, 108)
    lo = unpack_blocks(sc[:, :8].reshape(n, 1, 8), (0, 4), 0x0F).reshape(n, 16)
    hi = unpack_blocks(sc[:, 8:].reshape(n, 1, 4), (0, 2, 4, 6), 3).reshape(n, 16)
    scales = (lo | (hi << 4)).float() - 32.0
    dl = (d * scales).reshape(n, 16, 1)
    ql = unpack_blocks(qs, (0, 2, 4, 6), 3).reshape(n, 16, 16)
    qh = unpack_blocks(hmask, tuple(range(8)), 1).reshape(n, 16, 16) ^ 1
    q = ql.float() - (qh << 2).float()
    return (dl * q).reshape(n, QK_K)


def scale_min_k4(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed in the 12 scale bytes of q4_k/q5_k."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scale, mins


def _k4_affine(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``d * scale * q - dmin * min`` per 32-element sub-block of q4_k/q5_k."""
    n = b.shape[0]
    scale, mins = scale_min_k4(b[:, 4:16])
    dl = (_f16(b, 0) * scale.float()).reshape(n, 8, 1)
    ml = (_f16(b, 2) * mins.float()).reshape(n, 8, 1)
    return (dl * q.reshape(n, 8, 32).float() - ml).reshape(n, QK_K)


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k4_affine(b, nibbles(b[:, 16:144], 32))


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qh = unpack_blocks(b[:, 16:48].reshape(n, 1, 32), tuple(range(8)), 1).reshape(n, QK_K)
    return _k4_affine(b, nibbles(b[:, 48:176], 32) | (qh << 4))


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = nibbles(b[:, :128], 64)
    qh = unpack_blocks(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, QK_K)
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    dl = (_f16(b, 208) * scales).reshape(n, 16, 1)
    q = (ql | (qh << 4)).float() - 32.0
    return (dl * q.reshape(n, 16, 16)).reshape(n, QK_K)


# --------------------------------------------------------------------------- registry

_DEQUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "f32": _deq_f32,
    "f16": _deq_f16,
    "bf16": _deq_bf16,
    "q8_0": _deq_q8_0,
    "q4_0": _deq_q4_0,
    "q4_1": _deq_q4_1,
    "q5_0": _deq_q5_0,
    "q5_1": _deq_q5_1,
    "q2_k": _deq_q2_k,
    "q3_k": _deq_q3_k,
    "q4_k": _deq_q4_k,
    "q5_k": _deq_q5_k,
    "q6_k": _deq_q6_k,
}

# (name, GGMLQuantizationType value, elements per block, bytes per block): see gguf.constants.
_TYPES: tuple[tuple[str, int, int, int], ...] = (
    ("f32", 0, 1, 4),
    ("f16", 1, 1, 2),
    ("q4_0", 2, 32, 2 + 16),
    ("q4_1", 3, 32, 2 + 2 + 16),
    ("q5_0", 6, 32, 2 + 4 + 16),
    ("q5_1", 7, 32, 2 + 2 + 4 + 16),
    ("q8_0", 8, 32, 2 + 32),
    ("q2_k", 10, QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    ("q3_k", 11, QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    ("q4_k", 12, QK_K, 2 + 2 + QK_K // 2 + 12),
    ("q5_k", 13, QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    ("q6_k", 14, QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    ("bf16", 30, 1, 2),
)

BLOCK_TYPES: dict[str, BlockType] = {t[0]: BlockType(*t) for t in _TYPES}
BY_GGML_TYPE: dict[int, BlockType] = {t.ggml_type: t for t in BLOCK_TYPES.values()}


def block_type(name_or_id: str | int) -> BlockType:
    """The :class:`BlockType` for a pace name (case-insensitive) or a ggml type id."""
    if isinstance(name_or_id, str):
        found = BLOCK_TYPES.get(name_or_id.lower())
    else:
        found = BY_GGML_TYPE.get(int(name_or_id))
    if found is None:
        supported = ", ".join(f"{t.name} ({t.ggml_type})" for t in BLOCK_TYPES.values())
        raise ValueError(f"unsupported GGUF tensor type {name_or_id!r}; supported: {supported}")
    return found


# --------------------------------------------------------------------------- quantizers


def _blocks_f32(w: torch.Tensor, bt: BlockType) -> tuple[torch.Size, torch.Tensor]:
    if w.dim() == 0:
        raise ValueError(f"{bt.name}: cannot quantize a 0-d tensor")
    bt.row_bytes(w.shape[-1])  # validates the row length
    return w.shape[:-1], w.detach().to(torch.float32).reshape(-1, bt.block_elems)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``1 / d``, or 0 where ``d == 0`` (as gguf's ``np.where(d == 0, 0, 1 / d)``)."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _f16_bytes(d: torch.Tensor) -> torch.Tensor:
    return d.to(torch.float16).view(torch.uint8)


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """Quantize float ``[..., K]`` to raw q8_0 ``uint8 [..., K // 32 * 34]`` (as gguf)."""
    bt = BLOCK_TYPES["q8_0"]
    lead, x = _blocks_f32(w, bt)
    d = x.abs().amax(dim=-1, keepdim=True) / 127.0
    v = x * _inverse(d)
    # gguf's np_roundf: round half away from zero, with every step exact in float32.
    a = v.abs()
    fl = torch.floor(a)
    q = torch.sign(v) * (fl + torch.floor(2.0 * (a - fl)))
    raw = torch.cat([_f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=-1)
    return raw.reshape(*lead, -1)


def quantize_q4_0(w: torch.Tensor) -> torch.Tensor:
    """Quantize float ``[..., K]`` to raw q4_0 ``uint8 [..., K // 32 * 18]`` (as gguf)."""
    bt = BLOCK_TYPES["q4_0"]
    lead, x = _blocks_f32(w, bt)
    imax = x.abs().argmax(dim=-1, keepdim=True)  # first maximum, as numpy
    d = torch.gather(x, -1, imax) / -8.0
    q = torch.trunc(x * _inverse(d) + 8.5).to(torch.uint8).clamp_(0, 15)
    packed = q[:, :16] | (q[:, 16:] << 4)
    raw = torch.cat([_f16_bytes(d), packed], dim=-1)
    return raw.reshape(*lead, -1)


# --------------------------------------------------------------------------- k-quant writers
def _f16_rounded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` rounded to float16 (as float32) and its bytes ``[..., 2]``."""
    h = x.to(torch.float16)
    return h.float(), h.view(torch.uint8)


def _pack(q: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Pack codes ``[N, E]`` (each < 2**bits) ggml-style: byte ``j`` of each run of ``group``
    bytes holds, from its low bits up, elements ``j``, ``j + group``, ... of its
    ``8 // bits * group`` elements."""
    n = q.shape[0]
    per = 8 // bits
    shifts = (torch.arange(per, dtype=torch.int32) * bits).view(1, 1, per, 1)
    fields = q.to(torch.int32).view(n, -1, per, group) << shifts
    return fields.sum(dim=2).to(torch.uint8).reshape(n, -1)


def _affine(x: torch.Tensor, sub: int, qmax: int, cmax: int):
    """``q2_k``/``q4_k``/``q5_k``: per sub-block ``d * sc * q - dmin * m``, codes
    ``q <= qmax``, ``sc, m <= cmax``."""
    n = x.shape[0]
    xs = x.view(n, -1, sub)
    lo, hi = xs.amin(-1).clamp(max=0), xs.amax(-1).clamp(min=0)
    scale, mins = (hi - lo) / qmax, -lo
    d, d_raw = _f16_rounded(scale.amax(-1, keepdim=True) / cmax)
    dmin, dmin_raw = _f16_rounded(mins.amax(-1, keepdim=True) / cmax)
    sc = torch.round(scale * _inverse(d)).clamp(0, cmax)
    m = torch.round(mins * _inverse(dmin)).clamp(0, cmax)
    step, off = (d * sc).unsqueeze(-1), (dmin * m).unsqueeze(-1)
    q = torch.round((xs + off) * _inverse(step)).clamp(0, qmax)
    u8 = torch.uint8
    return d_raw, dmin_raw, sc.to(u8), m.to(u8), q.to(u8).reshape(n, QK_K)


def _symmetric(x: torch.Tensor, sub: int, qneg: int, cmax: int):
    """``q3_k``/``q6_k``: per sub-block ``d * sc * q``, ``-qneg <= q < qneg``,
    ``-cmax - 1 <= sc <= cmax``; each sub-block's largest magnitude maps to ``-qneg``."""
    n = x.shape[0]
    xs = x.view(n, -1, sub)
    ext = torch.gather(xs, -1, xs.abs().argmax(-1, keepdim=True)).squeeze(-1)
    scale = ext / -qneg
    d, d_raw = _f16_rounded(scale.abs().amax(-1, keepdim=True) / cmax)
    sc = torch.round(scale * _inverse(d)).clamp(-cmax - 1, cmax)
    q = torch.round(xs * _inverse((d * sc).unsqueeze(-1))).clamp(-qneg, qneg - 1)
    return d_raw, sc.to(torch.int32), q.to(torch.int32).reshape(n, QK_K)


def _scales_k4(sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins -> the 12 scale bytes of q4_k/q5_k."""
    lo_d = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_m = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    md = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return torch.cat([lo_d, lo_m, md], dim=-1)


def _q2_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, m, q = _affine(x, 16, 3, 15)
    return torch.cat([sc | (m << 4), _pack(q, 2, 32), d, dmin], dim=-1)


def _q3_k(x: torch.Tensor) -> torch.Tensor:
    d, sc, q = _symmetric(x, 16, 4, 31)
    u = q + 4  # 0..7: two low bits, and a high bit that is set for q >= 0
    c = sc + 32  # 0..63
    lo = (c[:, :8] & 0x0F) | ((c[:, 8:] & 0x0F) << 4)
    hi = _pack((c >> 4) & 3, 2, 4)
    scales = torch.cat([lo.to(torch.uint8), hi], dim=-1)
    return torch.cat([_pack(u >> 2, 1, 32), _pack(u & 3, 2, 32), scales, d], dim=-1)


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, m, q = _affine(x, 32, 15, 63)
    return torch.cat([d, dmin, _scales_k4(sc, m), _pack(q, 4, 32)], dim=-1)


def _q5_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, m, q = _affine(x, 32, 31, 63)
    qh, qs = _pack(q >> 4, 1, 32), _pack(q & 0x0F, 4, 32)
    return torch.cat([d, dmin, _scales_k4(sc, m), qh, qs], dim=-1)


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    d, sc, q = _symmetric(x, 16, 32, 127)
    u = q + 32  # 0..63
    scales = sc.to(torch.int8).view(torch.uint8)
    return torch.cat([_pack(u & 0x0F, 4, 64), _pack(u >> 4, 2, 32), scales, d], dim=-1)


K_QUANT_WRITERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "q2_k": _q2_k,
    "q3_k": _q3_k,
    "q4_k": _q4_k,
    "q5_k": _q5_k,
    "q6_k": _q6_k,
}


def quantize_k(w: torch.Tensor, kind: str) -> torch.Tensor:
    """Float ``[N, K]`` (``K % 256 == 0``) -> raw ``uint8 [N, K // 256 * block_bytes]`` of the
    k-quant ``kind`` (``q2_k`` ... ``q6_k``). Round-to-nearest with each (sub-)block's range,
    not llama.cpp's searched scales: valid blocks for kernels and tests, a little less
    accurate than ``llama-quantize``'s."""
    n, k = w.shape
    if k % QK_K:
        raise ValueError(f"{kind}: row of {k} elements is not a multiple of {QK_K}")
    blocks = K_QUANT_WRITERS[kind](w.detach().float().reshape(-1, QK_K))
    return blocks.reshape(n, -1)
