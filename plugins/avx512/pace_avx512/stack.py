"""The fused ``decoder_stack``: a model's blocks run by one C++ loop (csrc/stack.cpp).

``prepare`` reads the blocks' descriptions (``block.describe()``, the frozen dataclasses of
``pace_core.stack_spec``: the contract, not the core's block classes), checks that they are
pre-norm or sandwich blocks whose every kernel is pace-avx512's, and hands them to the
extension's ``DecoderStack``, which reads their fields (and the packed weights they hold) by
name once. Each forward step over a cache that exposes its buffers runs all blocks in one C++
call, ragged rows included (left-padded prefills, prefill chunks and decodes in one step):
``direct_buffers()`` of the contiguous caches (per-layer ``[B, H, capacity, D]``), or
``block_buffers()`` of the block caches (paged, slab: per-layer pools and the step's block
table, written and read through the table). Steps over other caches run the same blocks in
Python (:func:`cache_buffers` says why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_avx512 import build, kernels
from pace_avx512.packing import PackedGatedMLP, PackedLinear, PackedQKV
from pace_avx512.qpacking import QPackedGatedMLP, QPackedLinear, QPackedQKV
from pace_core.caches.base import Window
from pace_core.stack_spec import AttentionSpec, BlockSpec, BoundKernel, GatedMLPSpec, NormSpec

FUSABLE_BLOCKS = frozenset({"pre_norm", "sandwich"})  # stack_spec.BlockSpec kinds
log = logging.getLogger("pace.ops")
_declined: set[str] = set()  # reasons already logged (once per process each)


class NotFusable(ValueError):
    """A block the C++ loop does not cover (the resolver then uses the Python loop)."""


@dataclass(frozen=True)
class FusedStack:
    layers: tuple[Callable, ...]  # the blocks, for steps the C++ loop does not take
    cpp: Any  # the extension's DecoderStack
    rotaries: tuple[Any, ...]  # the step's rope tables are looked up by these, in order
    windows: tuple[Window, ...]  # the step's masks, in order


def _own(bound: BoundKernel, kernel: Callable, packed: tuple[type, ...], what: str) -> None:
    if bound.fn is not kernel or not isinstance(bound.weight, packed):
        raise NotFusable(f"{what} is not on pace-avx512's {kernel.__name__}")


def _check_norm(norm: NormSpec | None) -> None:
    if norm is not None and norm.fn not in (kernels.rms_norm, kernels.layer_norm):
        raise NotFusable(f"norm kernel {norm.fn!r} is not pace-avx512's")


def _check_attention(attn: AttentionSpec) -> None:
    if not isinstance(attn, AttentionSpec):
        raise NotFusable(f"{type(attn).__name__} attention is not fused")
    _own(attn.qkv, kernels.qkv_proj, (PackedQKV, QPackedQKV), "the QKV projection")
    _own(attn.o_proj, kernels.linear, (PackedLinear, QPackedLinear), "the output projection")
    if attn.attend is not kernels.attention:
        raise NotFusable("attention is not pace-avx512's")
    if attn.rope is not None and attn.rope.fn is not kernels.rope:
        raise NotFusable("rope is not pace-avx512's")
    _check_norm(attn.q_norm)
    _check_norm(attn.k_norm)
    if attn.norms_after_rope:
        raise NotFusable("QK-norms after rope are not fused")
    if attn.temperature is not None:
        raise NotFusable("attention temperature tuning is not fused")
    if attn.v_norm is not None:
        raise NotFusable("value norms are not fused")


def check(block: BlockSpec) -> None:
    """Raise NotFusable unless the C++ loop runs ``block`` with pace-avx512's own kernels."""
    if block.kind not in FUSABLE_BLOCKS:
        raise NotFusable(f"{block.kind} blocks are not fused")
    for norm in block.norms:
        _check_norm(norm)
    _check_attention(block.attention)
    if not isinstance(block.mlp, GatedMLPSpec):
        raise NotFusable(f"MLP {type(block.mlp).__name__} is not a gated MLP")
    _own(block.mlp.kernel, kernels.gated_mlp, (PackedGatedMLP, QPackedGatedMLP), "the gated MLP")
    _check_even(block)


def _check_even(block: BlockSpec) -> None:
    """Dense bf16 weights multiply k-pairs: the C++ step's rows carry no zero pad lane, so an
    odd K (hidden, heads x head_dim or intermediate size) stays on the per-call kernels."""
    attn, mlp = block.attention, block.mlp.kernel.weight
    dense = [  # (packed weight, K)
        (w.weight, w.in_features)
        for w in (attn.qkv.weight.linear, attn.o_proj.weight)
        if isinstance(w, PackedLinear)
    ]
    if isinstance(mlp, PackedGatedMLP):
        dense += [(mlp.gate_up, mlp.hidden), (mlp.down, mlp.intermediate)]
    odd = [k for w, k in dense if w.dtype == torch.bfloat16 and k % 2]
    if odd:
        raise NotFusable(f"bf16 weights with an odd K ({odd}) are not fused")


def _slot(table: dict, key: Any, value: Any) -> int:
    """Position of ``key`` in ``table`` (insertion order), added with ``value`` if new."""
    table.setdefault(key, value)
    return list(table).index(key)


def prepare(layers: Sequence[Callable]) -> FusedStack:
    blocks = [layer.describe() for layer in layers]
    for block in blocks:
        check(block)
    rotaries: dict[int, Any] = {}  # id -> rotary, in the order the layers index them
    windows: dict[Window, None] = {}
    ropes = [block.attention.rope for block in blocks]
    cpp = build.load_extension().DecoderStack(
        blocks=blocks,
        rope_slots=[-1 if r is None else _slot(rotaries, id(r.rotary), r.rotary) for r in ropes],
        mask_slots=[_slot(windows, block.attention.window, None) for block in blocks],
    )
    return FusedStack(
        layers=tuple(layers), cpp=cpp, rotaries=tuple(rotaries.values()), windows=tuple(windows)
    )


def cache_buffers(step: Any) -> tuple[list, list, torch.Tensor | None, int] | str:
    """``(keys, values, block_table, block_size)`` the C++ loop writes and reads this step
    (``block_table`` None for a contiguous cache), or why the step runs in Python."""
    if step.meta is None:
        return "no cache step (the forward has no StepMeta)"
    direct = getattr(step.cache, "direct_buffers", None)
    if direct is not None:
        keys, values = direct()
        return keys, values, None, 0
    blocks = getattr(step.cache, "block_buffers", None)
    if blocks is not None:
        buf = blocks()
        return buf.keys, buf.values, buf.block_table, buf.block_size
    return f"{type(step.cache).__name__} exposes neither direct_buffers() nor block_buffers()"


def decoder_stack(
    x: torch.Tensor, residual: torch.Tensor | None, step: Any, w: FusedStack
) -> tuple[torch.Tensor, torch.Tensor | None]:
    buffers = cache_buffers(step)
    if isinstance(buffers, str):
        if buffers not in _declined:
            _declined.add(buffers)
            log.info("decoder_stack: avx512 runs this step's layers in Python: %s", buffers)
        for layer in w.layers:
            x, residual = layer(x, residual, step)
        return x, residual
    keys, values, table, block_size = buffers
    meta = step.meta
    ropes = [step.rope[id(r)] for r in w.rotaries]
    masks = [meta.mask(window) for window in w.windows]
    return w.cpp.run(
        x, residual, keys, values, meta.starts, meta.counts, meta.max_len, masks, ropes, table,
        block_size, last_only=step.last_only,
    )  # fmt: skip
