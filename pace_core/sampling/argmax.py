"""The greedy token of each row of ``[B, V]`` logits, faster than ``Tensor.argmax`` on CPU.

torch's CPU argmax walks a row element by element (2-4 GB/s here: 10-15 ms for 32 rows of
Gemma 3's 262k vocabulary, ~8% of a 32-row decode step), while ``amax`` is vectorized
(~30 GB/s). :func:`greedy_argmax` takes the max of each block of :data:`BLOCK` values, the
argmax over the block maxima, then the argmax inside the winning block: the same index as
``argmax`` (its first maximal value; a NaN counts as the maximum, the first NaN wins).
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 64
"""Values per block; vocabularies are padded to multiples of 64 (other sizes use argmax)."""


def greedy_argmax(logits: Tensor) -> Tensor:
    """``logits.argmax(dim=-1)`` for logits ``[..., V]``: LongTensor ``[...]``."""
    vocab = logits.shape[-1] if logits.dim() else 0
    if vocab % BLOCK or vocab < 4 * BLOCK or not logits.is_cpu:
        return logits.argmax(dim=-1)
    lead = logits.shape[:-1]
    blocks = logits.contiguous().view(-1, vocab // BLOCK, BLOCK)
    best_block = blocks.amax(dim=-1).argmax(dim=-1)
    inside = blocks[torch.arange(blocks.shape[0]), best_block].argmax(dim=-1)
    return (best_block * BLOCK + inside).view(lead)
