"""Automatic prefix caching in the block caches: shared, reference-counted, copy-on-write
blocks, LRU eviction, and pool accounting under random join / grow / crop / fork / finish
sequences (hypothesis). Every layer's K of a token is a function of (token, position), so a
block holding the wrong tokens — a stale cached block, a missed copy-on-write — shows up as
wrong KV for some live sequence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pace_core.caches.base import CacheFullError
from pace_core.caches.block_pool import BlockPool, block_keys
from pace_core.caches.blocks import PagedCache, SlabPoolCache

HEADS, DIM = 2, 4


def kv_of(tokens: list[int], start: int) -> torch.Tensor:
    """[1, H, T, D]: position p of token t holds t * 1000 + p everywhere."""
    pos = torch.arange(start, start + len(tokens), dtype=torch.float32)
    vals = torch.tensor(tokens, dtype=torch.float32) * 1000 + pos
    return vals.view(1, 1, -1, 1).expand(1, HEADS, -1, DIM).contiguous()


def write(cache, sid: int, tokens: list[int], start: int) -> None:
    cache.begin_step([sid], [len(tokens)], len(tokens))
    k = kv_of(tokens, start)
    cache.update(0, k, -k)
    cache.end_step()


def check_kv(cache, sid: int, tokens: list[int]) -> None:
    ((k, v),) = cache.get_kv_states(sid)
    expected = kv_of(tokens, 0)[0]
    assert torch.equal(k, expected) and torch.equal(v, -expected), f"sequence {sid} KV"


def new_cache(block: int, tokens: int, kind=PagedCache):
    cache = kind([HEADS], [DIM], torch.float32, block_size=block, max_tokens=tokens)
    cache.enable_prefix_caching(b"model-a")
    return cache


def join(cache, tokens: list[int], salt: str = "") -> tuple[int, int]:
    (sid,) = cache.add_sequences(1)
    adopted = cache.adopt_prefix(sid, tokens, salt)
    write(cache, sid, tokens[adopted:], adopted)
    return sid, adopted


def test_a_shared_prefix_is_adopted_and_never_the_whole_prompt():
    cache = new_cache(4, 64)
    prompt = list(range(10, 20))  # 2 full blocks + 2 tokens
    a, adopted = join(cache, prompt)
    assert adopted == 0
    b, adopted = join(cache, [*prompt[:8], 99, 98, 97])
    assert adopted == 8
    assert cache.blocks[b][:2] == cache.blocks[a][:2] and cache.pool.ref[cache.blocks[a][0]] == 2
    c, adopted = join(cache, prompt[:8])  # all 8 are cached, the last token is recomputed
    assert adopted == 4
    for sid, toks in ((a, prompt), (b, [*prompt[:8], 99, 98, 97]), (c, prompt[:8])):
        check_kv(cache, sid, toks)
    cache.pool.check()


def test_salt_and_namespace_isolate():
    cache = new_cache(4, 64)
    prompt = list(range(9))
    join(cache, prompt, salt="tenant-1")
    assert join(cache, prompt, salt="tenant-2")[1] == 0
    assert join(cache, prompt, salt="tenant-1")[1] == 8
    assert block_keys(prompt, 4, b"model-a") != block_keys(prompt, 4, b"model-b")


def test_freed_blocks_stay_cached_until_evicted_lru():
    cache = new_cache(4, 16)  # 4 blocks
    a, _ = join(cache, list(range(9)))  # 3 blocks, 2 indexed
    cache.free_sequence(a)
    assert cache.num_free_blocks == 4 and len(cache.pool.cached) == 2
    b, adopted = join(cache, list(range(9)))
    assert adopted == 8 and not cache.pool.cached
    cache.free_sequence(b)
    c, adopted = join(cache, list(range(100, 113)))  # needs all 4 blocks: evicts both
    old = block_keys(list(range(9)), 4, b"model-a")[:2]
    assert adopted == 0 and not any(k in cache.pool.block_of for k in old)
    check_kv(cache, c, list(range(100, 113)))
    cache.pool.check()


def test_copy_on_write_for_forks_and_crops_into_indexed_blocks():
    cache = new_cache(4, 64)
    a, _ = join(cache, list(range(6)))
    (a2, b) = cache.retain([a, a])  # a beam-search fork shares the partial block
    shared = cache.blocks[b][1]
    assert cache.pool.ref[shared] == 2
    write(cache, b, [50], 6)
    write(cache, a2, [60, 61], 6)
    assert cache.blocks[b][1] != cache.blocks[a2][1]
    check_kv(cache, b, [*range(6), 50])
    check_kv(cache, a2, [*range(6), 60, 61])
    c, _ = join(cache, list(range(20, 29)))  # blocks 0, 1 indexed
    cache.crop(c, 3)  # back into indexed block 1
    write(cache, c, [7, 7, 7], 6)
    check_kv(cache, c, [20, 21, 22, 23, 24, 25, 7, 7, 7])
    d, adopted = join(cache, list(range(20, 29)))
    assert adopted == 8
    check_kv(cache, d, list(range(20, 29)))  # the indexed blocks kept the original tokens
    cache.pool.check()


def test_without_prefix_caching_nothing_is_indexed():
    cache = PagedCache([HEADS], [DIM], torch.float32, block_size=4, max_tokens=64)
    a, adopted = join(cache, list(range(9)))
    old = block_keys(list(range(9)), 4, b"model-a")[:2]
    assert adopted == 0 and not any(k in cache.pool.block_of for k in old)
    cache.free_sequence(a)
    assert len(cache.pool.free) == cache.num_blocks


PREFIXES = [[7] * 9, list(range(30, 43)), [5, 6] * 6]
ops = st.lists(
    st.tuples(
        st.sampled_from(["join", "join", "grow", "crop", "fork", "free"]),
        st.integers(0, 7),
        st.integers(0, 12),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(ops=ops, block=st.sampled_from([2, 4]), kind=st.sampled_from([PagedCache, SlabPoolCache]))
def test_random_sequences_keep_kv_and_accounting_right(ops, block, kind):
    cache = new_cache(block, 48, kind)
    live: dict[int, list[int]] = {}
    for op, pick, n in ops:
        ids = sorted(live)
        if op == "join":
            prompt = PREFIXES[pick % 3][: n + 1] + [100 + pick] * (pick % 3)
            (sid,) = cache.add_sequences(1)
            adopted = cache.adopt_prefix(sid, prompt)
            assert adopted <= len(prompt) - 1 and adopted % block == 0
            try:
                write(cache, sid, prompt[adopted:], adopted)
                live[sid] = prompt
            except CacheFullError:
                cache.free_sequence(sid)  # rejected: nothing may leak
        elif op == "grow" and ids:
            sid = ids[pick % len(ids)]
            more = [200 + n] * (1 + n % 3)
            try:
                write(cache, sid, more, len(live[sid]))
                live[sid] = live[sid] + more
            except CacheFullError:
                pass
        elif op == "crop" and ids:
            sid = ids[pick % len(ids)]
            cut = min(n, len(live[sid]))
            cache.crop(sid, cut)
            live[sid] = live[sid][: len(live[sid]) - cut]
        elif op == "fork" and ids:
            sid = ids[pick % len(ids)]
            kept = cache.retain([*ids, sid])
            live[kept[-1]] = list(live[sid])
        elif op == "free" and ids:
            sid = ids[pick % len(ids)]
            cache.free_sequence(sid)
            del live[sid]
        cache.pool.check()
        referenced = {b for s in live for b in cache.blocks[s]}
        assert cache.pool.used == len(referenced)
        for sid, toks in live.items():
            check_kv(cache, sid, toks)
    for sid in list(live):
        cache.free_sequence(sid)
    assert cache.num_free_blocks == cache.num_blocks and cache.memory_used() == 0


def test_pool_rejects_over_release_and_over_take():
    pool = BlockPool(2)
    (b,) = pool.take(1)
    pool.release([b])
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release([b])
    with pytest.raises(RuntimeError, match="take"):
        BlockPool(1).take(2)
