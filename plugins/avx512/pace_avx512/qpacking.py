"""Quantized weights (``pace_core.quant.QuantizedWeight``) in the layout of ``csrc/qlinear.cpp``.

Every grouped format becomes one of the kernel kinds (:data:`KINDS`) with groups of 32
along K: 8-bit codes with an fp16 scale per row and group (``int8`` of any group size, GGUF
``q8_0``, and ``q5_0`` as codes ``q - 16``); GGUF ``q6_k`` as 6-bit codes with the file's own tables
(``q6``: codes ``q`` in -32..31 stored as ``u = q + 32``, per super-block of 256 k an fp16
``d``, per 16 k an int8 scale ``sc``; the kernels take ``d sc`` in fp32: 6.625 bits per
weight, the file 6.5625; ``int8-g16`` holds the same weight as 8-bit codes with ``d sc``
rounded to fp16, 9 bits per weight); 4-bit codes with an fp16 scale and min per row and group
(``int4`` with mins, ``q4_1``), or with a scale only (symmetric ``int4``, ``q4_0``: the kernel
uses the min ``-8 s``); GGUF ``q4_k`` as 4-bit codes with the file's own tables (``q4k``: per
super-block of 256 k fp16 ``d`` and ``dmin``, per 32 the 6-bit scale ``sc`` and min ``m`` as
bytes; the kernels take ``d sc`` and ``-dmin m`` in fp32, GGUF's own de-quantization: 4.625
bits per weight, the file 4.5; ``int4`` holds the same weight with those products rounded to
fp16, 5 bits per weight). Scales of a coarser group repeat per 32. ``w8a8``
(:func:`is_w8a8`: int8 with one scale per row and int8 activations) has a layout of its own
for the integer GEMM (``csrc/igemm.cpp``): per block of 16 rows their fp32 scales, then the
unsigned codes in k-quads.

Per block of 16 rows, one contiguous span read front to back, padded to 64 bytes: runs of
groups (2 when a group's tables take 32 bytes: int8 with a scale per 32, symmetric 4-bit; 8,
a super-block, for ``q4k`` and ``q6``; else 1), each run its groups' tables, then their codes;
a group's tables are fp16 scales ``[16]`` (``[2][16]`` for int8-g16), then (4-bit with mins)
fp16 mins ``[16]``; a ``q4k`` run's are fp16 ``d [16]``, ``dmin [16]``, then bytes ``sc
[8][16]``, ``m [8][16]`` (320 bytes; with 8 groups' codes 2368 per 16 rows x 256 k); a ``q6``
run's fp16 ``d [16]``, int8 ``sc [16][16]``, 32 bytes of padding (320; with its codes 3392).
Codes are unsigned bytes
in k-quads (the ``vpdpbusd`` operand): byte ``4j + e`` of a quad = row j, k = 4 quad + e.
8-bit codes are stored as ``q + 128``, a group as 8 quads of 64 bytes; 4-bit codes as 4 lines
of 64 bytes, line v holding quad 2v in the low nibbles and 2v + 1 in the high ones; 6-bit codes
``u`` per 16 k (quads 4s..4s + 3) as a high line s, then the 4-bit lines 2s and 2s + 1 of
``u & 15``: bits ``2 (q % 4)`` and ``2 (q % 4) + 1`` of byte ``4j + e`` of high line ``q / 4``
are ``u >> 4`` of that byte of quad q (384 bytes per block and group; the kernels read it in
ascending order, csrc/qblock.h).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from pace_avx512 import build, settings
from pace_core.quant import QuantizedWeight
from pace_core.quant.gguf_blocks import nibbles, q5_values, scale_min_k4, unpack_blocks

GROUP = 32  # k per quantization group of the kernel
ROWS = 16  # rows per packed block
FORMATS = ("int8", "int4", "q8_0", "q5_0", "q4_0", "q4_1", "q4_k", "q6_k")
# kernels.h Kind
KINDS = {"int4": 0, "int8": 1, "int8-g16": 2, "int4-sym": 3, "w8a8": 4, "q6": 5, "q4k": 6}
# Kinds ``pack(w, kind=...)`` may hold a format in instead of its own, for comparisons.
_OVERRIDES = {("q6_k", "int8-g16"), ("q4_k", "int4")}
SUPER = 256  # k per GGUF k-quant super-block: one run of kinds q4k and q6
_INT8_KINDS = (KINDS["int8"], KINDS["int8-g16"])
_SUPER_KINDS = (KINDS["q4k"], KINDS["q6"])  # a run per super-block, the file's tables

CHUNK_ROWS = 1024  # rows converted at a time (bounds the temporaries) at K <= 2048
CHUNK_ELEMENTS = CHUNK_ROWS * 2048  # fewer rows at a time for wider K: temporaries ~2M values


def qlinear_path(rows: int, dtype: torch.dtype, int8_activations: bool, kind: int) -> str:
    """How a ``qlinear`` call of ``rows`` activation rows of ``dtype`` on a weight of ``kind``
    (:data:`KINDS`) computes: bf16 rows of a weight packed with ``int8_activations`` as
    ``"int8"`` (``amax / 127`` per 32, per 256 against kinds q4k and q6: csrc/q4k_tile.h,
    csrc/q6k_tile.h); other bf16 calls the kernels send to the bf16 panel (an AVX512-BF16 or
    avx2 build, from ``qpanel_rows`` rows; on avx2 the kinds with a scale per 16 k: kernels.h
    ``panel_call``) as
    ``"bf16-panel"`` (qpanel.cpp: weights de-quantized to bf16, activations as they are); the
    rest (every fp32 call) as ``"split"`` (csrc/qlinear.cpp: 15-bit activations, ``amax /
    16256``)."""
    if dtype == torch.bfloat16 and int8_activations:
        return "int8"
    ext = build.load_extension()
    if dtype == torch.bfloat16 and ext.has_bf16_panel and ext.panel_call(kind, rows):
        return "bf16-panel"
    return "split"


@dataclass(frozen=True)
class QPackedLinear:
    weight: torch.Tensor  # uint8 [blocks, block_stride]
    bias: torch.Tensor | None  # fp32 [N]
    kind: int  # KINDS
    out_features: int
    in_features: int
    dtype: torch.dtype  # what rows() de-quantizes to
    int8_activations: bool = False  # bf16 rows quantized to int8 (pace_avx512.settings)
    w8a8: bool = False  # fp32 rows too (QuantizedWeight.activations == "int8")
    act_scales: torch.Tensor | None = None  # static int8 scales fp32 [K / 32] (calibrated)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the de-quantized ``[N, K]`` matrix (a tied embedding's lookup)."""
        ext = build.load_extension()
        out = ext.qpacked_rows(
            self.weight, ids.long(), self.out_features, self.in_features, self.kind
        )
        return out.to(self.dtype)


def problem(format_: str, k: int) -> str | None:
    """Why weights of ``format_`` (formats joined by ``+`` for an op whose matrices differ)
    with rows of ``k`` cannot be packed, or None."""
    missing = [f for f in format_.split("+") if f not in FORMATS]
    if missing:
        return f"weight format {'+'.join(missing)} not implemented (have {', '.join(FORMATS)})"
    if k % GROUP:
        return f"row length {k} is not a multiple of {GROUP}"
    return None


def _codes_tables(w: QuantizedWeight, rows: slice, kind: int):
    """``(codes [n, K] (int8, or uint8 0..15), tables)``: for kind q4k fp16 d and dmin ``[n,
    K / 256]`` and uint8 sub-block scales and mins ``[n, K / 32]``; else fp16 scales ``[n, G]``
    (``[n, 2G]`` for q6_k) and, 4-bit with mins, fp16 mins ``[n, G]``."""
    n = len(range(*rows.indices(w.shape[0])))
    k = w.shape[1]
    data = w.data[rows]
    fmt = w.format
    if fmt in ("int8", "int4"):
        repeat = (k // w.scales.shape[1]) // GROUP
        scales = w.scales[rows].repeat_interleave(repeat, dim=1)
        if fmt == "int8":
            return data, [scales]
        codes = torch.stack([data & 0x0F, data >> 4], dim=-1).reshape(n, k)
        if w.mins is None:  # symmetric: (q - 8) s, the kernel's min -8 s
            return codes, [scales]
        return codes, [scales, w.mins[rows].repeat_interleave(repeat, dim=1)]
    if fmt == "q6_k":
        b = data.reshape(-1, 210)
        ql = nibbles(b[:, :128], 64)
        qh = unpack_blocks(b[:, 128:192].reshape(-1, 2, 32), (0, 2, 4, 6), 3).reshape(-1, 256)
        codes = ((ql | (qh << 4)).to(torch.int16) - 32).to(torch.int8).reshape(n, k)
        sc = b[:, 192:208].contiguous().view(torch.int8)
        d = b[:, 208:210].contiguous().view(torch.float16)
        if kind == KINDS["q6"]:  # the file's tables as they are, 32 bytes of padding
            pad = torch.zeros(n, k // SUPER, dtype=torch.int16)
            return codes, [d.reshape(n, -1), sc.reshape(n, -1), pad]
        return codes, [(d.float() * sc.float()).reshape(n, k // 16).half()]  # kind int8-g16
    if fmt == "q4_k":
        b = data.reshape(n, k // SUPER, 144)
        sc, mn = scale_min_k4(b[..., 4:16].reshape(-1, 12))
        qs = b[..., 16:].reshape(n, k // 64, 1, 32)
        codes = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, k)
        if kind == KINDS["q4k"]:  # the file's tables as they are
            d, dmin = (b[..., at : at + 2].contiguous().view(torch.float16) for at in (0, 2))
            return codes, [d.reshape(n, -1), dmin.reshape(n, -1), sc.view(n, -1), mn.view(n, -1)]
        d, dmin = _f16(b, 0), _f16(b, 2)  # kind int4: fp16 products
        scales = (d.unsqueeze(-1) * sc.view(n, -1, 8).float()).reshape(n, -1).half()
        mins = (-dmin.unsqueeze(-1) * mn.view(n, -1, 8).float()).reshape(n, -1).half()
        return codes, [scales, mins]
    size = {"q8_0": 34, "q5_0": 22, "q4_0": 18, "q4_1": 20}[fmt]
    b = data.reshape(n, k // GROUP, size)
    scales = _f16(b, 0).half()
    if fmt == "q5_0":  # (q - 16) * d with q of 5 bits: int8 codes
        q = q5_values(b.reshape(-1, size), 2).to(torch.int16) - 16
        return q.to(torch.int8).reshape(n, k), [scales]
    if fmt == "q8_0":
        return b[..., 2:].contiguous().view(torch.int8).reshape(n, k), [scales]
    start = 2 if fmt == "q4_0" else 4
    qs = b[..., start:].unsqueeze(2)  # [n, G, 1, 16]: low nibbles k 0..15, high 16..31
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, k)
    return codes, [scales] if fmt == "q4_0" else [scales, _f16(b, 2).half()]


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at byte ``offset`` of every block ``[n, G, bytes]`` as fp32 ``[n, G]``."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).squeeze(-1).float()


def _block_bytes(codes: torch.Tensor, tables: Sequence[torch.Tensor], kind: int) -> torch.Tensor:
    """One chunk (rows a multiple of 16) of ``kind`` as ``[blocks, block_stride]`` bytes, its
    ``tables`` (:func:`_codes_tables`) in order, each ``[16]`` rows per group (kind q4k: per
    super-block, then ``[8][16]``) as that group's or super-block's."""
    n, k = codes.shape
    nb, g = n // ROWS, k // GROUP
    units = k // (SUPER if kind in _SUPER_KINDS else GROUP)  # what the tables are per
    int8, q6 = kind in _INT8_KINDS, kind == KINDS["q6"]
    if int8 or q6:  # unsigned q + 128 / q + 32
        codes = (codes.to(torch.int16) + (128 if int8 else 32)).to(torch.uint8)
    quads = codes.view(nb, ROWS, g, 8, 4).permute(0, 2, 3, 1, 4)  # [nb, G, quad, row, 4]
    if int8:
        lines = quads.contiguous()
    else:  # line v: quad 2v | quad 2v + 1 << 4 (q6: the low 4 bits, after their high line)
        halves = (quads & 0x0F).reshape(nb, g, 4, 2, 64)
        lines = halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)
        if q6:  # high line h: quad 4h + i's u >> 4 at bits 2i, 2i + 1
            high = (quads >> 4).reshape(nb, g, 2, 4, 64)
            high = (
                high[:, :, :, 0]
                | high[:, :, :, 1] << 2
                | high[:, :, :, 2] << 4
                | (high[:, :, :, 3] << 6)
            )
            nibbles = lines.reshape(nb, g, 2, 2, 64)  # per 16 k: high line s, nibbles 2s, 2s + 1
            lines = torch.cat([high.unsqueeze(3), nibbles], dim=3)
    groups = lines.reshape(nb, units, -1)  # [nb, units, code bytes]
    tables = torch.cat([  # [nb, units, table bytes]: e.g. scales [SUB][16], then mins [16]
        table.view(nb, ROWS, units, -1).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
        .reshape(nb, units, -1)
        for table in tables
    ], dim=2)  # fmt: skip
    run = 2 if tables.shape[2] == 32 else 1  # units per run (csrc/kernels.h qrun_groups)
    whole = units // run * run
    parts = [torch.cat([  # runs of `run` units: their tables, then their codes
        tables[:, :whole].reshape(nb, whole // run, -1),
        groups[:, :whole].reshape(nb, whole // run, -1),
    ], dim=2).reshape(nb, -1)] if whole else []  # fmt: skip
    if whole < units:  # an odd last group: a run of its own
        parts += [tables[:, whole:].reshape(nb, -1), groups[:, whole:].reshape(nb, -1)]
    out = torch.cat(parts, dim=1)
    pad = -out.shape[1] % 64
    return F.pad(out, (0, pad)) if pad else out


def _w8a8_block_bytes(w: QuantizedWeight, rows: slice) -> torch.Tensor:
    """``rows`` of a per-channel W8A8 weight as ``[blocks, 64 + 16 K]`` bytes (csrc/igemm.cpp):
    each block's 16 fp32 row scales, then its unsigned codes in k-quads."""
    codes, scales = w.data[rows], w.scales[rows].float()
    pad = -codes.shape[0] % ROWS
    codes, scales = F.pad(codes, (0, 0, 0, pad)), F.pad(scales, (0, 0, 0, pad))
    n, k = codes.shape
    nb = n // ROWS
    quads = (codes.to(torch.int16) + 128).to(torch.uint8).view(nb, ROWS, k // 4, 4)
    lines = quads.permute(0, 2, 1, 3).reshape(nb, -1)  # [nb, quad, row, 4]
    return torch.cat([scales.float().reshape(nb, ROWS).view(torch.uint8), lines], dim=1)


def is_w8a8(w: QuantizedWeight) -> bool:
    """Whether ``w`` packs as the W8A8 kind: int8 with one scale per row, int8 activations."""
    return w.format == "int8" and w.activations == "int8" and w.group_size == w.shape[1]


def pack(
    w: QuantizedWeight | Sequence[QuantizedWeight], kind: str | None = None
) -> tuple[torch.Tensor, int]:
    """``(packed uint8 [blocks, block_stride], kind)`` of ``w``, converted in row chunks. A
    sequence of weights in one format packs as their stack along rows, each written straight
    into its blocks of the one buffer (no stacked copy of the codes: the 28 MB of a 3B model's
    last gate/up at the load's peak), unless a part before the last has rows that are not a
    multiple of 16 (then they are stacked first). ``kind`` (a :data:`KINDS` name) overrides
    the format's kind where another holds the same weight, for comparisons: ``"int8-g16"`` for
    ``q6_k`` (8-bit codes and its sub-block scales times d rounded to fp16, 9 bits per weight:
    the layout before ``q6``) and ``"int4"`` for ``q4_k`` (its sub-block scales and mins times
    d / dmin rounded to fp16 per group: 5 bits per weight, the layout before ``q4k``)."""
    parts = [w] if isinstance(w, QuantizedWeight) else list(w)
    if any(part.shape[0] % ROWS for part in parts[:-1]):
        parts = [QuantizedWeight.cat(parts)]
    first = parts[0]
    if (why := problem(first.format, first.shape[1])) is not None:
        raise ValueError(f"pace-avx512 cannot pack this weight: {why}")
    if is_w8a8(first):
        return _pack_chunks(parts, _w8a8_block_bytes), KINDS["w8a8"]
    symmetric = first.format == "q4_0" or (first.format == "int4" and first.mins is None)
    own_kinds = {"int8": "int8", "q8_0": "int8", "q5_0": "int8", "q6_k": "q6", "q4_k": "q4k"}
    own = own_kinds.get(first.format, "int4-sym" if symmetric else "int4")
    if kind is not None and kind != own and (first.format, kind) not in _OVERRIDES:
        raise ValueError(f"pace-avx512 cannot pack {first.format} as kind {kind}")
    code = KINDS[kind or own]
    return _pack_chunks(parts, partial(_grouped_block_bytes, kind=code)), code


def _grouped_block_bytes(w: QuantizedWeight, rows: slice, kind: int) -> torch.Tensor:
    """``rows`` of ``w`` as the grouped kinds' blocks (rows padded to a multiple of 16)."""
    codes, tables = _codes_tables(w, rows, kind)
    pad = -codes.shape[0] % ROWS
    if pad:
        codes = F.pad(codes, (0, 0, 0, pad))
        tables = [F.pad(table, (0, 0, 0, pad)) for table in tables]
    return _block_bytes(codes, tables, kind)


def _pack_chunks(parts: Sequence[QuantizedWeight], blocks_of) -> torch.Tensor:
    """``blocks_of(part, rows)`` (the packed blocks of a slice of a part's rows) over every
    part in row chunks, into one huge-page buffer allocated once the first chunk gives the
    block stride."""
    total = sum(-(-part.shape[0] // ROWS) for part in parts)
    k = parts[0].shape[1]
    step = max(ROWS, min(CHUNK_ROWS, CHUNK_ELEMENTS // k) // ROWS * ROWS)
    packed, at = None, 0
    for part in parts:
        n = part.shape[0]
        for start in range(0, n, step):
            blocks = blocks_of(part, slice(start, min(n, start + step)))
            if packed is None:
                packed = build.load_extension().huge_page_empty(total, blocks.shape[1])
            packed[at : at + blocks.shape[0]] = blocks
            at += blocks.shape[0]
    return packed


def prepare_linear(
    w: QuantizedWeight | Sequence[QuantizedWeight],
    bias: torch.Tensor | None = None,
    int8_activations: bool | None = None,
    kind: str | None = None,
) -> QPackedLinear:
    """``w`` (or weights of one format stacked along rows, :func:`pack`) packed; its bf16
    activations int8 or 15-bit as given, by default as ``PACE_QUANT_ACTIVATIONS`` says now
    (:mod:`pace_avx512.settings`). A W8A8 weight (``activations == "int8"``) takes int8
    activations in every dtype. ``kind``: as :func:`pack`'s."""
    parts = [w] if isinstance(w, QuantizedWeight) else list(w)
    first = parts[0]
    w8a8 = first.activations == "int8"
    if int8_activations is None:
        int8_activations = settings.int8_activations()
    packed, code = pack(parts, kind)
    n, k = sum(part.shape[0] for part in parts), first.shape[1]
    b = None if bias is None else bias.reshape(-1).float().contiguous()
    fixed = first.activation_scales
    fixed = None if fixed is None else fixed.float().contiguous()
    return QPackedLinear(packed, b, code, int(n), int(k), first.dtype, int8_activations or w8a8,
                         w8a8, fixed)  # fmt: skip


@dataclass(frozen=True)
class QPackedQKV:
    linear: QPackedLinear | tuple[QPackedLinear, ...]  # [wq; wk; wv], or one per format
    sizes: tuple[int, int, int]


@dataclass(frozen=True)
class QPackedGatedMLP:
    gate_up: QPackedLinear | tuple[QPackedLinear, ...]  # [gate; up], or (gate, up)
    down: QPackedLinear
    activation: int  # code: its index in the extension's ACTIVATIONS (as PackedGatedMLP's)
    intermediate: int
    hidden: int


def prepare_qkv(
    weights: Sequence[QuantizedWeight], biases: Sequence[torch.Tensor] | None = None
) -> QPackedQKV:
    sizes = tuple(int(w.shape[0]) for w in weights)
    if not _same_format(weights):  # GGUF's Q4_K_M keeps some V rows in q6_k
        parts = biases if biases is not None else [None] * len(weights)
        packed = tuple(prepare_linear(w, b) for w, b in zip(weights, parts, strict=True))
        return QPackedQKV(packed, sizes)  # type: ignore[arg-type]
    bias = torch.cat([b.reshape(-1) for b in biases]) if biases is not None else None
    return QPackedQKV(prepare_linear(weights, bias), sizes)  # type: ignore[arg-type]


def prepare_gated_mlp(
    gate: QuantizedWeight, up: QuantizedWeight, down: QuantizedWeight, activation: str
) -> QPackedGatedMLP:
    if _same_format([gate, up]):
        gate_up: QPackedLinear | tuple = prepare_linear([gate, up])
    else:
        gate_up = (prepare_linear(gate), prepare_linear(up))
    code = build.load_extension().ACTIVATIONS.index(activation)
    return QPackedGatedMLP(gate_up, prepare_linear(down), code, int(gate.shape[0]),
                           int(gate.shape[1]))  # fmt: skip


def _same_format(weights: Sequence[QuantizedWeight]) -> bool:
    """Whether the matrices stack into one (one format, group size and dtype)."""
    first = weights[0]
    return all((w.format, w.group_size, w.dtype, w.mins is None)
               == (first.format, first.group_size, first.dtype, first.mins is None)
               for w in weights)  # fmt: skip
