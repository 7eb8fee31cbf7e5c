"""The KV cache contract shared by every cache type, and the per-step metadata.

A cache holds sequences, each with its own length (no shared slots, no padding in the cache).
A forward step processes ``T`` new positions for a batch of sequences; row ``b`` has
``num_new[b] <= T`` real tokens, right-aligned (left padding in the query only). The engine:

1. ``meta = cache.begin_step(seq_ids, num_new, T)`` — reserves room (may raise CacheFullError);
2. each attention layer calls ``view = cache.update(layer, k, v)`` and passes the view to its
   attention kernel, which reads it according to ``cache.layout``;
3. ``cache.end_step()`` — the new tokens become part of the sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from pace_core.errors import PaceError


@dataclass(frozen=True)
class ChunkedWindow:
    """Chunked local attention (Llama 4): a query sees the keys of its own ``size``-position
    chunk only (``key // size == query // size``), causally."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"attention chunk size must be >= 1, got {self.size}")


# Which keys a layer's queries see besides causality: None (all), a sliding window of that
# many positions, or a chunk.
Window = int | ChunkedWindow | None


class CacheFullError(PaceError, RuntimeError):
    """The cache's memory budget cannot hold the requested tokens; nothing was changed."""

    def __init__(self, message: str, *, requested_tokens: int = 0, free_tokens: int = 0) -> None:
        super().__init__(message)
        self.requested_tokens = requested_tokens
        self.free_tokens = free_tokens


@dataclass
class StepMeta:
    """Which sequences a forward step touches and where its new tokens go.

    Built from Python ints (``starts``, ``counts``); the tensors and masks kernels read are
    derived once per step, on first use (every layer asks). A decode step (one new token per
    row) takes short paths: its positions are the starts, its masks one comparison each."""

    seq_ids: list[int]
    starts: list[int]  # tokens already cached per row
    counts: list[int]  # real new tokens per row (right-aligned in ``width``); a tensor is read
    width: int  # T, the padded number of new positions
    _masks: dict[Window, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # the protocol's num_new may be a tensor; a list is copied (the caller keeps its own)
        counts = self.counts
        self.counts = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)
        if not len(self.seq_ids) == len(self.starts) == len(self.counts):
            raise ValueError(
                f"step of {len(self.seq_ids)} sequences has {len(self.starts)} starts and "
                f"{len(self.counts)} counts"
            )

    @cached_property
    def lens_before(self) -> torch.Tensor:
        """``[B]`` tokens already cached per row."""
        return torch.tensor(self.starts, dtype=torch.long)

    @cached_property
    def num_new(self) -> torch.Tensor:
        """``[B]`` real new tokens per row."""
        return torch.tensor(self.counts, dtype=torch.long)

    @cached_property
    def ends(self) -> list[int]:
        """Tokens per row after the step."""
        return [s + c for s, c in zip(self.starts, self.counts)]

    @cached_property
    def lens_after(self) -> torch.Tensor:
        return torch.tensor(self.ends, dtype=torch.long)

    @cached_property
    def max_len(self) -> int:
        """Longest row after the step (``S`` of the attention views)."""
        return max(self.ends, default=0)

    @cached_property
    def uniform(self) -> bool:
        """All rows start at the same length and add ``width`` tokens (no padding)."""
        return all(c == self.width for c in self.counts) and len(set(self.starts)) <= 1

    @cached_property
    def uniform_start(self) -> int:
        """Where the new tokens go when the step is ``uniform``."""
        return self.starts[0]

    @cached_property
    def decode(self) -> bool:
        """One new token in every row (no padding)."""
        return self.width == 1 and all(c == 1 for c in self.counts)

    def positions(self) -> torch.Tensor:
        """Position ids ``[B, T]`` of the new tokens (pads get 0)."""
        if self.decode:
            return self.lens_before.view(-1, 1)
        t = torch.arange(self.width)
        pos = self.lens_before[:, None] + t[None] - (self.width - self.num_new)[:, None]
        return pos.clamp(min=0)

    def query_valid(self) -> torch.Tensor:
        """``[B, T]`` True where the new position holds a real token."""
        return torch.arange(self.width)[None] >= (self.width - self.num_new)[:, None]

    def mask(self, window: Window) -> torch.Tensor:
        """Boolean attention mask ``[B, 1, T, S]`` (True = attend) over each row's keys
        ``0..S-1`` (``S`` = longest row after the step): causal, within its own length and the
        ``window`` (sliding or chunked). Pad queries see key 0 only, so no row is fully
        masked."""
        found = self._masks.get(window)
        if found is None:
            found = self._decode_mask(window) if self.decode else self._mask(window)
            self._masks[window] = found
        return found

    def _decode_mask(self, window: Window) -> torch.Tensor:
        """:meth:`mask` of a decode step: the query is each row's last position."""
        keys = torch.arange(self.max_len)[None]  # [1, S]
        ends = self.lens_after[:, None]
        mask = keys < ends
        if isinstance(window, ChunkedWindow):
            mask &= keys // window.size == (ends - 1) // window.size
        elif window is not None:
            mask &= keys >= ends - window
        return mask.view(len(self.seq_ids), 1, 1, -1)

    def _mask(self, window: Window) -> torch.Tensor:
        """:meth:`mask` from each query's key range ``[first, last]``: two comparisons over
        ``[B, T, S]`` instead of one per condition (a mixed serving step of 26 rows, 58
        positions and 214 keys: 0.33 against 0.52 ms)."""
        qpos = self.lens_before[:, None] + torch.arange(self.width)[None] - (
            self.width - self.num_new
        )[:, None]  # [B, T]: a real query's position; causal, so it sees keys <= qpos
        if isinstance(window, ChunkedWindow):
            first = qpos.div(window.size, rounding_mode="floor") * window.size
        elif window is not None:
            first = qpos - (window - 1)
        else:
            first = torch.zeros_like(qpos)
        pad = ~self.query_valid()
        first = first.masked_fill(pad, 0)
        last = qpos.masked_fill(pad, 0)  # pad queries: key 0 only
        keys = torch.arange(self.max_len)
        return ((keys >= first[..., None]) & (keys <= last[..., None])).unsqueeze(1)


@runtime_checkable
class KVCache(Protocol):
    """What the engine, attention kernels and speculative decoding use."""

    layout: str

    def add_sequences(self, count: int) -> list[int]:
        """Create ``count`` empty sequences; return their ids."""

    def retain(self, seq_ids: list[int]) -> list[int]:
        """Keep exactly ``seq_ids`` in this order (ids may repeat: forks for beam search);
        free all others. Returns the ids to use from now on."""

    def begin_step(
        self, seq_ids: list[int], num_new: list[int] | torch.Tensor, width: int
    ) -> StepMeta:
        """Reserve room for the new tokens of a forward step."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Any:
        """Store ``k, v [B, H, T, D]`` of the current step; return this layer's view."""

    def end_step(self) -> None:
        """Commit the step's tokens to the sequences."""

    def crop(self, seq_id: int, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` tokens of a sequence (speculative rollback)."""

    def get_num_tokens(self, seq_id: int) -> int:
        """Tokens held for ``seq_id``."""

    def get_kv_states(self, seq_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(keys, values)`` ``[heads, tokens, head_dim]`` of one sequence (a copy)."""

    def memory_used(self) -> int:
        """Bytes of KV storage in use."""

    def memory_free(self) -> int:
        """Bytes still available before CacheFullError (0 if unbounded growth)."""


@runtime_checkable
class ReservingKVCache(KVCache, Protocol):
    """A contiguous cache (one dense buffer per layer, a row per sequence, every step over all
    rows in order) that can make room for a whole generation up front."""

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` per row now, so no step grows the buffers."""

    def direct_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K/V ``[B, H, capacity, D]`` a fused stack writes and reads itself."""


@runtime_checkable
class BlockKVCache(KVCache, Protocol):
    """A pool of fixed-size token blocks shared by all sequences through block tables: what
    continuous batching, prefix caching and fused stacks over blocks use."""

    block_size: int
    num_blocks: int

    @property
    def num_free_blocks(self) -> int:
        """Blocks a step can still take (free and unreferenced cached ones)."""

    @property
    def prefix_caching(self) -> bool:
        """Whether written full blocks are indexed and adopted by new sequences."""

    def free_sequence(self, seq_id: int) -> None:
        """Free one sequence's tokens; the other ids stay valid (``retain`` frees many)."""

    def enable_prefix_caching(self, namespace: bytes = b"") -> None:
        """Index written full blocks; ``namespace`` names what else changes the KV."""

    def adopt_prefix(self, seq_id: int, tokens: Sequence[int], salt: str = "") -> int:
        """Give the new, empty ``seq_id`` the longest indexed run of ``tokens``' full blocks
        (never all of them); returns the tokens adopted."""

    def cached_prefix_tokens(self, tokens: Sequence[int], salt: str = "") -> int:
        """How many tokens :meth:`adopt_prefix` would adopt for ``tokens`` now."""

    def prefix_keys(self, tokens: Sequence[int], salt: str = "") -> list[Any]:
        """The index keys of ``tokens``' full blocks (a key covers every token before it)."""

    def populate(self) -> int:
        """Commit every page of the pools now; returns the bytes committed."""

    def block_buffers(self) -> Any:
        """The pools and this step's block table, for a fused stack (between steps: error)."""


CACHE_PROTOCOLS: dict[str, type] = {
    "contiguous": ReservingKVCache,
    "paged": BlockKVCache,
    "slab": BlockKVCache,
}
"""The protocol a cache of each built-in layout implements (checked at registration)."""


def missing_members(cls: type, protocol: type) -> list[str]:
    """The members of ``protocol`` (and its bases) that class ``cls`` lacks."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base is object or base is Protocol or not getattr(base, "_is_protocol", False):
            continue
        names |= {n for n in vars(base) if not n.startswith("_")}
        names |= set(getattr(base, "__annotations__", {}))
    return sorted(n for n in names if not hasattr(cls, n) and n not in _INSTANCE_ATTRS)


_INSTANCE_ATTRS = {"block_size", "num_blocks"}  # set in __init__, not on the class
