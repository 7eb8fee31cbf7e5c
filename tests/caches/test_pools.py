"""Cache accounting: no leaked blocks, typed exhaustion, crop, growth policies, compatibility."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pace_core.caches.base import CacheFullError
from pace_core.caches.blocks import PagedCache, SlabPoolCache, slab_block_tokens
from pace_core.caches.contiguous import BMCCache, DynamicCache
from pace_core.errors import ConfigError


def append(cache, ids, counts):
    width = max(counts)
    k = torch.randn(len(ids), 2, width, 8)
    cache.begin_step(ids, counts, width)
    cache.update(0, k, k.clone())
    cache.end_step()
    return k


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "grow", "crop", "free"]), st.integers(0, 5), st.integers(1, 9)
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, block=st.sampled_from([1, 4, 16]))
def test_block_pool_accounting(ops, block):
    cache = PagedCache([2], [8], torch.float32, block_size=block, max_tokens=64)
    live: dict[int, int] = {}
    for op, pick, n in ops:
        ids = sorted(live)
        if op == "add":
            live.update(dict.fromkeys(cache.add_sequences(1), 0))
        elif op == "grow" and ids:
            sid = ids[pick % len(ids)]
            try:
                append(cache, [sid], [n])
                live[sid] += n
            except CacheFullError as err:
                assert err.requested_tokens == n
        elif op == "crop" and ids:
            sid = ids[pick % len(ids)]
            cut = min(n, live[sid])
            cache.crop(sid, cut)
            live[sid] -= cut
        elif op == "free" and ids:
            keep = [s for s in ids if s != ids[pick % len(ids)]]
            cache.retain(keep)
            live = {s: live[s] for s in keep}
        used = sum(-(-n // block) for n in live.values())
        assert cache.num_blocks - cache.num_free_blocks == used
        cache.pool.check()
        assert {s: cache.get_num_tokens(s) for s in live} == live
    cache.retain([])
    assert cache.num_free_blocks == cache.num_blocks and cache.memory_used() == 0


def test_exhaustion_is_typed_and_leaves_others_intact():
    cache = PagedCache([2], [8], torch.float32, block_size=4, max_tokens=16)
    a, b = cache.add_sequences(2)
    ka = append(cache, [a], [6])
    before = cache.get_kv_states(a)
    with pytest.raises(CacheFullError, match="KV cache full") as err:
        append(cache, [a, b], [1, 12])
    assert err.value.free_tokens == 8
    assert cache.get_num_tokens(a) == 6 and cache.get_num_tokens(b) == 0
    assert torch.equal(cache.get_kv_states(a)[0][0], before[0][0])
    assert torch.equal(before[0][0], ka[0])
    append(cache, [a, b], [1, 4])  # what fits still works


def test_crop_then_regrow_matches_fresh():
    for cache in (
        DynamicCache([2], [8], torch.float32),
        PagedCache([2], [8], torch.float32, block_size=4, max_tokens=64),
    ):
        (sid,) = cache.add_sequences(1)
        k1 = append(cache, [sid], [7])
        cache.crop(sid, 3)
        k2 = append(cache, [sid], [2])
        keys = cache.get_kv_states(sid)[0][0]
        assert torch.equal(keys, torch.cat([k1[0, :, :4], k2[0]], dim=1))
        with pytest.raises(ValueError, match="cannot crop 9"):
            cache.crop(sid, 9)


def test_fork_for_beams_copies_blocks():
    cache = PagedCache([2], [8], torch.float32, block_size=4, max_tokens=64)
    a, b = cache.add_sequences(2)
    append(cache, [a, b], [5, 3])
    x, y, z = cache.retain([a, a, b])
    assert x == a and y != a and z == b
    assert torch.equal(cache.get_kv_states(x)[0][0], cache.get_kv_states(y)[0][0])
    append(cache, [x, y, z], [1, 1, 1])
    assert not torch.equal(cache.get_kv_states(x)[0][0], cache.get_kv_states(y)[0][0])


def test_dynamic_growth_is_geometric_and_bmc_by_segments():
    dyn = DynamicCache([2], [8], torch.float32)
    (sid,) = dyn.add_sequences(1)
    caps = set()
    for _ in range(300):
        append(dyn, [sid], [1])
        caps.add(dyn.capacity)
    assert sorted(caps) == [64, 128, 256, 512]
    bmc = BMCCache([2], [8], torch.float32, max_seq_len=400, num_splits=20)
    (sid,) = bmc.add_sequences(1)
    for _ in range(300):
        append(bmc, [sid], [1])
    assert bmc.segment == 20 and bmc.capacity == 300 and bmc.reallocations == 15


def test_budgets_and_env(monkeypatch):
    per_block = 2 * 2 * 8 * 4 * 64  # K+V, heads, dim, fp32 bytes, tokens
    cache = PagedCache([2], [8], torch.float32, memory_gb=per_block * 10 / (1 << 30))
    assert cache.block_size == 64 and cache.num_blocks == 10
    assert cache.memory_free() == 10 * per_block
    monkeypatch.setenv("PACE_MAX_CACHE_TOKENS", "256")
    assert PagedCache([2], [8], torch.float32).num_blocks == 4
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "16")
    assert PagedCache([2], [8], torch.float32).num_blocks == 16
    assert PagedCache([2], [8], torch.float32, block_size=32).block_size == 32
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "0")
    with pytest.raises(ConfigError, match="PACE_PAGED_BLOCK_TOKENS.*'0'"):
        PagedCache([2], [8], torch.float32)
    monkeypatch.delenv("PACE_PAGED_BLOCK_TOKENS")
    monkeypatch.setenv("PACE_MAX_CACHE_TOKENS", "lots")
    with pytest.raises(ConfigError, match="PACE_MAX_CACHE_TOKENS.*'lots'"):
        PagedCache([2], [8], torch.float32)
    with pytest.raises(ConfigError, match="kv_cache_memory_gb"):
        PagedCache([2], [8], torch.float32, memory_gb=-1)


def test_slab_block_size_from_l2(monkeypatch):
    monkeypatch.setattr("pace_core.caches.blocks.l2_cache_bytes", lambda: 2 << 20)
    # SmolLM2: 3 KV heads x 64 dims, bf16: 768 B/token/layer for K+V -> 1 MiB / 768 = 1365 -> 1024
    assert slab_block_tokens([3], [64], torch.bfloat16) == 1024
    # Gemma-3-270M: 1 KV head x 256, fp32: 2 KiB/token -> 512
    assert slab_block_tokens([1], [256], torch.float32) == 512
    monkeypatch.setenv("PACE_SLAB_BLOCK_TOKENS", "64")
    assert SlabPoolCache([1], [8], torch.float32, max_tokens=128).block_size == 64


@pytest.mark.parametrize("cls", [PagedCache, SlabPoolCache])
def test_block_buffers_say_where_update_writes(cls):
    """A ragged step (prefill chunk, decode, empty row, left padding) written by the rule
    block_buffers() documents lands exactly where update() puts it, for every layer."""
    cache = cls([2, 1], [8, 4], torch.float32, block_size=4, max_tokens=128)
    ids = cache.add_sequences(4)
    steps = [(ids, [5, 2, 0, 7]), (ids, [3, 1, 4, 1]), (ids[1:], [6, 0, 1])]
    gen = torch.Generator().manual_seed(0)
    for seq_ids, counts in steps:
        width = max(counts)
        meta = cache.begin_step(seq_ids, counts, width)
        buf = cache.block_buffers()
        assert buf.keys is cache.keys and buf.values is cache.values and buf.block_size == 4
        table = buf.block_table
        assert table.dtype == torch.long and table.shape[0] == len(seq_ids)
        assert table.shape[1] * 4 >= meta.max_len
        expect = [(k.clone(), v.clone()) for k, v in zip(cache.keys, cache.values)]
        for layer, (h, d) in enumerate(((2, 8), (1, 4))):
            k = torch.randn(len(seq_ids), h, width, d, generator=gen)
            v = torch.randn(len(seq_ids), h, width, d, generator=gen)
            for b, n in enumerate(counts):
                for j in range(n):
                    pos = int(meta.lens_before[b]) + j
                    block, off = int(table[b, pos // 4]), pos % 4
                    expect[layer][0][block, :, off] = k[b, :, width - n + j]
                    expect[layer][1][block, :, off] = v[b, :, width - n + j]
            view = cache.update(layer, k, v)
            assert view.block_table is table
        cache.end_step()
        for (k, v), (ek, ev) in zip(zip(cache.keys, cache.values), expect):
            assert torch.equal(k, ek) and torch.equal(v, ev)
    with pytest.raises(RuntimeError, match="between begin_step and end_step"):
        cache.block_buffers()


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("madvise", [True, False], ids=["madvise", "touch"])
def test_populate_commits_the_pools_and_keeps_their_contents(madvise, monkeypatch):
    """A serving engine's pool is committed up front (no page faults mid-step), by
    MADV_POPULATE_WRITE or, without it, a write of one element per page."""
    from pace_core.caches import pages

    if not madvise:
        monkeypatch.setattr(pages, "_madvise", lambda: None)
    cache = PagedCache([4], [64], torch.bfloat16, block_size=16, max_tokens=1 << 17)  # 2x64 MiB
    cache.keys[0][7, 1, 3, 5] = 2.5
    cache.values[0][4095, 3, 15, 63] = -1.0
    before = _rss_bytes()
    assert cache.populate() == 2 * (64 << 20)
    assert _rss_bytes() - before > 0.9 * 2 * (64 << 20)
    assert float(cache.keys[0][7, 1, 3, 5]) == 2.5
    assert float(cache.values[0][4095, 3, 15, 63]) == -1.0
    assert int(cache.keys[0].count_nonzero()) == 1 and int(cache.values[0].count_nonzero()) == 1
    with pytest.raises(ValueError, match="contiguous"):
        pages.populate(cache.keys[0].transpose(0, 1))


def test_block_pools_start_zeroed_and_writable():
    """Pools come from zero-filled pages committed on first touch (pages.lazy_zeros)."""
    cache = PagedCache([3], [64], torch.bfloat16, block_size=16, max_tokens=1 << 16)
    pool = cache.keys[0]
    assert pool.shape == (4096, 3, 16, 64) and pool.dtype == torch.bfloat16
    assert not pool[[0, 2047, 4095]].any()
    pool[4095, 2, 15, 63] = 1.5
    assert float(pool[4095, 2, 15, 63]) == 1.5 and not cache.values[0].any()
    tiny = PagedCache([1], [2], torch.float32, block_size=1, max_tokens=2)  # below a page
    assert tiny.keys[0].shape == (2, 1, 1, 2) and not tiny.keys[0].any()
