"""The scheduler: which sequences run, and how many of their prompt tokens, in each step.

It holds no model: it books KV, admits, plans prompt chunks, adopts cached prefixes and
releases sequences, over the cache's sequence and block bookkeeping only (its tests run with a
real block pool and no weights). Sequences move ``waiting`` -> ``prefilling`` -> ``running``
and leave when they finish or are cancelled.

Two admission policies, chosen by the cache:

* **continuous** (a :class:`~pace_core.caches.base.BlockKVCache`, PAGED or SLAB_POOL): FIFO
  admission while fewer than ``max_running`` sequences are active and the KV *booking* fits;
  a sequence books ``ceil((prompt + max_tokens) / block)`` blocks and keeps them until it
  finishes, so a running sequence never runs out of KV and nothing is preempted (the price:
  capacity held for tokens an early EOS never uses). Prompts adopt their longest cached
  prefix and are prefilled in chunks within the step's :class:`PrefillBudget`. With prefix
  caching, a prompt whose next uncached block is being computed for a prompt still in
  prefill waits for it (and the queue behind it waits too), then adopts it: a thousand
  prompts with one long instruction compute the instruction once.
* **whole batches** (a contiguous cache, DYNAMIC or BMC, whose steps cover all its rows in
  order): up to ``max_running`` sequences are admitted together once nothing is active, their
  prompts prefilled in one step, and the next batch waits until the last one finishes.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import torch

from pace_core.caches.base import BlockKVCache, KVCache, ReservingKVCache
from pace_core.engine.events import SeqSpec
from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.engine.prompt_logprobs import PromptScorer
from pace_core.models.embedding import PoolState
from pace_core.sampling.sampler import BatchSampler


class Request:
    """One sequence inside the core: its spec, where its KV lives and how far it got."""

    __slots__ = (
        "block_keys", "booked", "computed", "error", "last", "pool", "prompt", "sampler",
        "scorer", "seq_id", "spec", "tokens",
    )  # fmt: skip

    def __init__(self, spec: SeqSpec) -> None:
        self.spec = spec
        self.prompt = torch.tensor(spec.prompt, dtype=torch.long)
        self.seq_id = -1
        self.booked = 0  # KV blocks booked
        self.computed = 0  # prompt tokens prefilled so far (adopted ones included)
        self.last = -1  # last sampled token (the next decode input)
        self.sampler: BatchSampler | None = None  # its own row, until it joins the batch
        self.tokens: list[int] = []  # generated so far
        self.error: Exception | None = None  # why it could not be admitted
        self.block_keys: tuple[list, frozenset] | None = None  # prefix-cache keys, once asked
        self.pool: PoolState | None = None  # an embedding's pooled states so far
        self.scorer: PromptScorer | None = None  # its prompt logprobs so far, when asked for

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def prompt_left(self) -> int:
        return self.prompt.numel() - self.computed


def plan_chunks(remaining: Iterable[tuple[Request, int]], budget: int) -> list[tuple[Request, int]]:
    """``(request, tokens)`` chunks, FIFO, of the ``remaining`` prompt tokens per request,
    within ``budget`` tokens (the last chunk taken may be a part of its prompt)."""
    chunks: list[tuple[Request, int]] = []
    for item, left in remaining:
        if budget <= 0:
            break
        n = min(left, budget)
        chunks.append((item, n))
        budget -= n
    return chunks


class Scheduler:
    """Admission, KV booking, prompt chunks and release over one KV cache (see module doc).

    Args:
        cache: the engine's KV cache; a :class:`BlockKVCache` schedules continuously.
        max_running: most sequences prefilling or running at once.
        budget: prompt tokens per step (ignored for whole batches: one step prefills them).
        max_context: tokens a sequence may hold; a booking never exceeds it.
        wait_for_shared_prefix: hold the queue for a prefix another prompt is computing.
    """

    def __init__(
        self,
        cache: KVCache,
        max_running: int,
        budget: PrefillBudget,
        max_context: int | None = None,
        wait_for_shared_prefix: bool = False,
    ) -> None:
        self.cache = cache
        self.wait_for_shared_prefix = wait_for_shared_prefix
        self.max_context = max_context
        self.continuous = isinstance(cache, BlockKVCache)
        self.reserving = isinstance(cache, ReservingKVCache)
        self.max_running = max_running
        self.budget = budget
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.booked = 0

    # -- capacity --------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return int(self.cache.block_size) if self.continuous else 1

    @property
    def num_blocks(self) -> int | None:
        """Blocks of the pool; None for a contiguous cache (it grows)."""
        return int(self.cache.num_blocks) if self.continuous else None

    @property
    def capacity_tokens(self) -> int | None:
        blocks = self.num_blocks
        return None if blocks is None else blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def tokens_to_book(self, spec: SeqSpec) -> int:
        """Prompt + max_new_tokens, within the context window (a sequence stops there)."""
        need = spec.reserve_tokens
        return min(need, self.max_context) if self.max_context else need

    def kv_used_fraction(self) -> float:
        if not self.continuous:
            return 0.0
        return 1.0 - self.cache.num_free_blocks / self.num_blocks

    def kv_booked_fraction(self) -> float:
        return self.booked / self.num_blocks if self.continuous else 0.0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    @property
    def active(self) -> list[Request]:
        return self.prefilling + self.running

    # -- queueing ----------------------------------------------------------------------------
    def add(self, spec: SeqSpec) -> str | None:
        """Queue a sequence; returns why it can never run (its booking exceeds the pool)."""
        capacity = self.capacity_tokens
        need = self.tokens_to_book(spec)
        if capacity is not None and self.blocks_for(need) > self.num_blocks:
            return (
                f"the sequence needs {need} tokens of KV cache (prompt + max_tokens); the "
                f"engine's pool holds {capacity}"
            )
        self.waiting.append(Request(spec))
        return None

    def admit(self, prepare: Callable[[Request], None]) -> tuple[list[Request], list[Request]]:
        """Admit waiting sequences by the cache's policy. ``prepare(request)`` builds what the
        core needs per sequence and raises ``ValueError`` / ``TypeError`` /
        ``NotImplementedError`` for a sequence that cannot run; returns (admitted, failed),
        with each failed request's exception in its ``error``."""
        if not self.continuous and self.active:
            return [], []
        admitted: list[Request] = []
        failed: list[Request] = []
        while self.waiting and len(self.prefilling) + len(self.running) < self.max_running:
            req = self.waiting[0]
            need = self.blocks_for(self.tokens_to_book(req.spec)) if self.continuous else 0
            if self.continuous and self.booked + need > self.num_blocks:
                break
            adopts = self.continuous and not req.spec.keeps_every_position
            if adopts and self.wait_for_shared_prefix and self._shares_pending_block(req):
                break
            self.waiting.popleft()
            try:  # per-request problems surface here, not in the shared batch
                prepare(req)
            except (ValueError, TypeError, NotImplementedError) as exc:
                req.error = exc
                failed.append(req)
                continue
            req.booked = need
            self.booked += need
            (req.seq_id,) = self.cache.add_sequences(1)
            if adopts:
                req.computed = self.cache.adopt_prefix(
                    req.seq_id, req.spec.prompt, req.spec.cache_salt
                )
            self.prefilling.append(req)
            admitted.append(req)
        if admitted and self.reserving:
            # a whole batch: room for its longest sequence now, so no step grows the buffers
            self.cache.reserve(max(self.tokens_to_book(r.spec) for r in admitted))
        return admitted, failed

    def _shares_pending_block(self, req: Request) -> bool:
        """Whether ``req``'s first uncached full block is also a block of a prompt still in
        prefill (so it will be cached soon)."""
        cache = self.cache
        if not self.prefilling or not cache.prefix_caching:
            return False
        tokens = req.spec.prompt
        first = cache.cached_prefix_tokens(tokens, req.spec.cache_salt) // self.block_size
        if first >= (len(tokens) - 1) // self.block_size:  # nothing more it could adopt
            return False
        key = self._block_keys(req)[0][first]
        return any(key in self._block_keys(r)[1] for r in self.prefilling)

    def _block_keys(self, req: Request) -> tuple[list, frozenset]:
        if req.block_keys is None:
            keys = self.cache.prefix_keys(req.spec.prompt, req.spec.cache_salt)
            req.block_keys = (keys, frozenset(keys))
        return req.block_keys

    def chunks(self) -> list[tuple[Request, int]]:
        """This step's prompt chunks ``(request, tokens)``: FIFO within the prefill budget,
        or every admitted prompt whole (a contiguous cache steps all its rows together)."""
        remaining = [(r, r.prompt_left) for r in self.prefilling]
        if not self.continuous:
            return remaining
        return plan_chunks(remaining, self.budget.tokens(decoding=bool(self.running)))

    # -- progress ----------------------------------------------------------------------------
    def advance(self, chunks: list[tuple[Request, int]]) -> list[int]:
        """Count ``chunks`` as prefilled; returns the indices of the chunks whose request's
        prompt is complete."""
        done = []
        for i, (req, n) in enumerate(chunks):
            req.computed += n
            if req.prompt_left == 0:
                done.append(i)
        return done

    def join(self, requests: list[Request]) -> None:
        """Requests whose prefill completed start decoding."""
        for req in requests:
            self.prefilling.remove(req)
        self.running.extend(requests)

    def finish(self, rows: list[int]) -> list[int]:
        """Running rows ``rows`` leave (finished or cancelled) and free their KV; returns the
        indices of the rows that stay, in order."""
        gone = set(rows)
        keep = [j for j in range(len(self.running)) if j not in gone]
        leaving = [self.running[j] for j in rows]
        self.running = [self.running[j] for j in keep]
        self._release(leaving)
        return keep

    def cancel(self, keys: set[str]) -> list[int]:
        """Drop the sequences of ``keys`` wherever they are; returns the running rows that
        must leave (the caller calls :meth:`finish` with them, after its own bookkeeping)."""
        if any(r.key in keys for r in self.waiting):
            self.waiting = collections.deque(r for r in self.waiting if r.key not in keys)
        leaving = [r for r in self.prefilling if r.key in keys]
        if leaving:
            self.prefilling = [r for r in self.prefilling if r.key not in keys]
            self._release(leaving)
        return [j for j, r in enumerate(self.running) if r.key in keys]

    def clear(self, cache: KVCache) -> list[Request]:
        """Forget every active sequence (after a failed step) and take a fresh ``cache``;
        returns the requests that were active."""
        active = self.active
        self.prefilling, self.running, self.booked = [], [], 0
        self.cache = cache
        return active

    def drop_waiting(self) -> list[Request]:
        waiting, self.waiting = list(self.waiting), collections.deque()
        return waiting

    def _release(self, requests: list[Request]) -> None:
        for req in requests:
            self.booked -= req.booked
            req.booked = 0
        if self.continuous:
            for req in requests:
                self.cache.free_sequence(req.seq_id)
            return
        # a contiguous cache keeps exactly the live rows, renumbered in order
        alive = self.active
        new_ids = self.cache.retain([r.seq_id for r in alive])
        for req, sid in zip(alive, new_ids):
            req.seq_id = sid
