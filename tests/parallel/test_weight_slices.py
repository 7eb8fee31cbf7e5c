"""A rank's slices of checkpoint tensors: read from safetensors equal to cutting the whole
tensor (rows, columns, fused halves, a padded vocabulary, zeros); quantized weights cut along
whole groups, or a ConfigError naming the cut."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from pace_core.errors import ConfigError
from pace_core.models.weights import Slice, WeightStore, apply_slice, slice_quantized
from pace_core.parallel.shard import slice_rule, vocab_rows
from pace_core.quant import QuantizationConfig
from pace_core.quant.quantize import quantize

TENSORS = {
    "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 48),
    "model.layers.0.self_attn.o_proj.weight": torch.randn(48, 64),
    "model.layers.0.self_attn.o_proj.bias": torch.randn(48),
    "model.layers.0.mlp.experts.gate_up_proj": torch.randn(3, 40, 48),
    "model.layers.0.mlp.experts.down_proj": torch.randn(3, 48, 20),
    "lm_head.weight": torch.randn(101, 48),
    "model.norm.weight": torch.randn(48),
}


@pytest.mark.parametrize("rank", [0, 1])
def test_sliced_reads_equal_cut_tensors(tmp_path, rank):
    save_file({k: v.to(torch.bfloat16) for k, v in TENSORS.items()}, tmp_path / "model.safetensors")
    rule = slice_rule(rank, 2)
    read = WeightStore.from_dir(tmp_path)
    read.slice_by(rule)
    cut = WeightStore.from_tensors({k: v.to(torch.bfloat16) for k, v in TENSORS.items()})
    cut.slice_by(rule)
    for name, full in TENSORS.items():
        got = read.take(name, torch.float32)
        assert torch.equal(got, cut.take(name, torch.float32)), name
        part = rule(name, tuple(full.shape))
        want = full.to(torch.bfloat16).float() if part is None else apply_slice(
            full.to(torch.bfloat16).float(), part)  # fmt: skip
        assert torch.equal(got, want), name
    gate_up = read_again(tmp_path, rule, "model.layers.0.mlp.experts.gate_up_proj")
    full = TENSORS["model.layers.0.mlp.experts.gate_up_proj"].to(torch.bfloat16).float()
    half = slice(rank * 10, rank * 10 + 10)  # gate rows 0-19, up rows 20-39: 10 of each
    assert torch.equal(gate_up, torch.cat([full[:, half], full[:, 20:][:, half]], dim=1))
    head = read_again(tmp_path, rule, "lm_head.weight")
    first, end, per = vocab_rows(101, rank, 2)
    assert head.shape[0] == per == 51 and torch.all(head[end - first :] == 0)
    bias = read_again(tmp_path, rule, "model.layers.0.self_attn.o_proj.bias")
    assert torch.count_nonzero(bias) == (48 if rank == 0 else 0)  # added once, by rank 0


def read_again(path, rule, name):
    store = WeightStore.from_dir(path)
    store.slice_by(rule)
    return store.take(name, torch.float32)


def test_quantized_weights_cut_along_groups():
    w = torch.randn(16, 128)
    q = quantize(w, QuantizationConfig(bits=4, group_size=32, symmetric=False))
    cols = slice_quantized(q, Slice(1, ((64, 128),)))
    assert torch.allclose(
        cols.dequantize(dtype=torch.float32), q.dequantize(dtype=torch.float32)[:, 64:]
    )
    rows = slice_quantized(q, Slice(0, ((8, 16),)))
    assert torch.equal(rows.dequantize(), q.dequantize()[8:])
    with pytest.raises(ConfigError, match="cut through its quantization groups of 32"):
        slice_quantized(q, Slice(1, ((0, 48),)), "down_proj")


def test_tied_head_rows_padded_with_zeros():
    """A tied head takes its rows of the embedding table; the last rank's are padded with
    zero rows (dense and quantized alike)."""
    from pace_core.parallel.builder import _vocab_part

    w = torch.randn(101, 64)
    q = quantize(w, QuantizationConfig(bits=8, group_size=32))
    for table in (w, q):
        last = _vocab_part(table, 1, 2)
        rows = last.dequantize() if table is q else last
        full = q.dequantize() if table is q else w
        assert rows.shape == (51, 64) and torch.equal(rows[:50], full[51:])
        assert torch.count_nonzero(rows[50:]) == 0
