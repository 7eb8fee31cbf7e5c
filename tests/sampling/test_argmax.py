"""greedy_argmax gives Tensor.argmax's index: first maximum, NaN as the maximum (numpy's
argmax for float32/16/64, blocks of maxima for bfloat16)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pace_core.sampling.argmax import BLOCK, greedy_argmax

_VALUES = [-float("inf"), -1.0, 0.0, 2.5, float("inf"), float("nan")]


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    blocks=st.integers(4, 12),
    picks=st.lists(st.sampled_from(_VALUES), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_same_index_as_argmax_with_ties_infinities_and_nans(rows, blocks, picks, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    vocab = blocks * BLOCK
    # few distinct values, so maxima repeat within and across blocks
    x = torch.tensor(picks, dtype=dtype)[torch.randint(len(picks), (rows, vocab), generator=gen)]
    assert torch.equal(greedy_argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_random_logits_and_strided_rows(dtype):
    x = torch.randn(9, 2 * 49152, dtype=dtype)
    assert torch.equal(greedy_argmax(x), x.argmax(dim=-1))
    strided = x[::2, ::2]  # a view: copied to contiguous blocks
    assert torch.equal(greedy_argmax(strided), strided.argmax(dim=-1))


def test_vocabularies_off_the_block_size_use_argmax():
    x = torch.randn(3, 50257)
    assert torch.equal(greedy_argmax(x), x.argmax(dim=-1))
    small = torch.randn(2, 2 * BLOCK)
    assert torch.equal(greedy_argmax(small), small.argmax(dim=-1))


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 3, 4 * BLOCK)
    assert torch.equal(greedy_argmax(x), x.argmax(dim=-1))
    one = torch.randn(8 * BLOCK)
    assert greedy_argmax(one).shape == () and int(greedy_argmax(one)) == int(one.argmax())
    assert greedy_argmax(torch.randn(0, 4 * BLOCK)).shape == (0,)  # no rows


def test_inference_tensors_give_long_indices():
    with torch.inference_mode():
        x = torch.randn(2, 4 * BLOCK)
        got = greedy_argmax(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(dim=-1))
