"""Each cache type × native attention equals SDPA over the full K/V (prefill, decode, chunks),
with sliding and chunked windows; latent caches (no values) × native latent attention too."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pace_native.kernels import attention, latent_attention

from pace_core.caches.base import ChunkedWindow
from pace_core.caches.blocks import PagedCache, SlabPoolCache
from pace_core.caches.contiguous import BMCCache, DynamicCache

CACHES = {
    "dynamic": lambda h, d, dt, **kw: DynamicCache([h], [d], dt, **kw),
    "bmc": lambda h, d, dt, **kw: BMCCache([h], [d], dt, max_seq_len=64, **kw),
    "paged": lambda h, d, dt, **kw: PagedCache([h], [d], dt, block_size=4, max_tokens=512, **kw),
    "slab_pool": lambda h, d, dt, **kw: SlabPoolCache(
        [h], [d], dt, block_size=8, max_tokens=512, **kw
    ),
}


def reference(q, k, v, scale, window, sinks):
    """Causal attention of the last ``T`` queries over all ``S`` keys of one sequence."""
    t, s = q.shape[2], k.shape[2]
    qpos = torch.arange(s - t, s)[:, None]
    kpos = torch.arange(s)[None]
    mask = kpos <= qpos
    if isinstance(window, ChunkedWindow):
        mask &= kpos // window.size == qpos // window.size
    elif window is not None:
        mask &= qpos - kpos < window
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, -math.inf)
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    return probs @ v.float()


def run_steps(cache, seqs, chunks, hq, scale, window, sinks, dtype, attend=None):
    """Feed each sequence's K/V/Q in ``chunks`` (list of per-step token counts per row);
    ``attend(q, view)`` defaults to native attention with the given scale/sinks/window."""
    attend = attend or (lambda q, view: attention(q, view, scale, sinks, window))
    ids = cache.add_sequences(len(seqs))
    done = [0] * len(seqs)
    outs = [[] for _ in seqs]
    for step in chunks:
        width = max(step)
        b = len(seqs)
        d = seqs[0][0].shape[-1]
        hk = seqs[0][0].shape[0]
        k = torch.zeros(b, hk, width, d, dtype=dtype)
        v = torch.zeros(b, hk, width, seqs[0][1].shape[-1], dtype=dtype)
        q = torch.zeros(b, hq, width, d, dtype=dtype)
        for i, (ks, vs, qs) in enumerate(seqs):
            n = step[i]
            k[i, :, width - n :] = ks[:, done[i] : done[i] + n]
            v[i, :, width - n :] = vs[:, done[i] : done[i] + n]
            q[i, :, width - n :] = qs[:, done[i] : done[i] + n]
        cache.begin_step(ids, step, width)
        view = cache.update(0, k, v)
        out = attend(q, view)
        cache.end_step()
        for i, n in enumerate(step):
            outs[i].append(out[i, :, width - n :])
            done[i] += n
    return [torch.cat(o, dim=1) for o in outs]


@pytest.mark.parametrize("cache_type", list(CACHES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("hq", "hk", "d", "window", "with_sinks"),
    [(4, 4, 64, None, False), (6, 2, 128, None, True), (7, 1, 256, 5, False), (4, 2, 64, 3, True),
     (4, 2, 64, ChunkedWindow(4), False)],
)
def test_cache_attention_matches_reference(cache_type, dtype, hq, hk, d, window, with_sinks):
    gen = torch.Generator().manual_seed(hq * 100 + d)
    lens = [11, 6, 9]
    seqs = [
        tuple(torch.randn(h, n, d, generator=gen).to(dtype) for h in (hk, hk, hq)) for n in lens
    ]
    sinks = torch.randn(hq, generator=gen) if with_sinks else None
    scale = d**-0.5
    # ragged prefill in two chunks (left padding inside each step), then decode steps
    chunks = [[4, 2, 5], [3, 2, 2], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 0, 0]]
    # rows that finished their tokens get 0 new tokens in later steps
    chunks = [
        [min(c, n - sum(s[i] for s in chunks[:j])) for i, (c, n) in enumerate(zip(row, lens))]
        for j, row in enumerate(chunks)
    ]
    chunks = [c for c in chunks if max(c) > 0]
    cache = CACHES[cache_type](hk, d, dtype)
    outs = run_steps(cache, seqs, chunks, hq, scale, window, sinks, dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for (ks, vs, qs), got in zip(seqs, outs):
        want = reference(qs[None], ks[None], vs[None], scale, window, sinks)[0]
        n = got.shape[1]
        assert torch.allclose(got.float(), want[:, :n], atol=tol, rtol=tol)
        assert n == ks.shape[1]


@pytest.mark.parametrize("cache_type", list(CACHES))
def test_latent_cache_attention_matches_reference(cache_type):
    """MLA rows: one KV head of [latent | rope] keys and no values (``value_dims`` 0); latent
    attention's values are the keys' first ``rank`` dims, over every cache type."""
    gen = torch.Generator().manual_seed(5)
    rank, rope, hq, lens = 32, 8, 4, [11, 6, 9]
    d = rank + rope
    seqs = [(torch.randn(1, n, d, generator=gen), torch.zeros(1, n, 0),
             torch.randn(hq, n, d, generator=gen)) for n in lens]  # fmt: skip
    cache = CACHES[cache_type](1, d, torch.float32, value_dims=[0])
    assert cache.values[0].shape[-1] == 0  # no value storage at all
    chunks = [[4, 2, 5], [3, 2, 2], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 0, 0]]
    chunks = [[min(c, n - sum(s[i] for s in chunks[:j])) for i, (c, n) in
               enumerate(zip(row, lens))] for j, row in enumerate(chunks)]  # fmt: skip
    chunks = [c for c in chunks if max(c) > 0]
    outs = run_steps(cache, seqs, chunks, hq, 0.2, None, None, torch.float32,
                     attend=lambda q, view: latent_attention(q, view, 0.2, rank))  # fmt: skip
    for seq, (ks, _, qs), got in zip(range(len(lens)), seqs, outs):
        keys, values = cache.get_kv_states(seq)[0]  # what speculative rollback reads
        assert torch.equal(keys, ks) and values.shape == (1, ks.shape[1], 0)
        want = reference(qs[None], ks[None], ks[None, ..., :rank], 0.2, None, None)[0]
        assert got.shape == (hq, ks.shape[1], rank)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_contiguous_cache_prefill_uses_sdpa_semantics():
    """A uniform prefill on a dynamic cache equals plain causal SDPA."""
    q, k, v = (torch.randn(2, 4, 7, 32) for _ in range(3))
    cache = DynamicCache([4], [32], torch.float32)
    ids = cache.add_sequences(2)
    cache.begin_step(ids, [7, 7], 7)
    out = attention(q, cache.update(0, k, v), 32**-0.5)
    cache.end_step()
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
