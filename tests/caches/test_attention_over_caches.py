"""Each cache type × native attention equals SDPA over the full K/V (prefill, decode, chunks)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pace_native.kernels import attention

from pace_core.caches.blocks import PagedCache, SlabPoolCache
from pace_core.caches.contiguous import BMCCache, DynamicCache

CACHES = {
    "dynamic": lambda h, d, dt: DynamicCache([h], [d], dt),
    "bmc": lambda h, d, dt: BMCCache([h], [d], dt, max_seq_len=64),
    "paged": lambda h, d, dt: PagedCache([h], [d], dt, block_size=4, max_tokens=512),
    "slab_pool": lambda h, d, dt: SlabPoolCache([h], [d], dt, block_size=8, max_tokens=512),
}


def reference(q, k, v, scale, window, sinks):
    """Causal attention of the last ``T`` queries over all ``S`` keys of one sequence."""
    t, s = q.shape[2], k.shape[2]
    qpos = torch.arange(s - t, s)[:, None]
    kpos = torch.arange(s)[None]
    mask = kpos <= qpos
    if window is not None:
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


def run_steps(cache, seqs, chunks, hq, scale, window, sinks, dtype):
    """Feed each sequence's K/V/Q in ``chunks`` (list of per-step token counts per row)."""
    ids = cache.add_sequences(len(seqs))
    done = [0] * len(seqs)
    outs = [[] for _ in seqs]
    for step in chunks:
        width = max(step)
        b = len(seqs)
        d = seqs[0][0].shape[-1]
        hk = seqs[0][0].shape[0]
        k = torch.zeros(b, hk, width, d, dtype=dtype)
        v = torch.zeros_like(k)
        q = torch.zeros(b, hq, width, d, dtype=dtype)
        for i, (ks, vs, qs) in enumerate(seqs):
            n = step[i]
            k[i, :, width - n :] = ks[:, done[i] : done[i] + n]
            v[i, :, width - n :] = vs[:, done[i] : done[i] + n]
            q[i, :, width - n :] = qs[:, done[i] : done[i] + n]
        cache.begin_step(ids, step, width)
        view = cache.update(0, k, v)
        out = attention(q, view, scale, sinks, window)
        cache.end_step()
        for i, n in enumerate(step):
            outs[i].append(out[i, :, width - n :])
            done[i] += n
    return [torch.cat(o, dim=1) for o in outs]


@pytest.mark.parametrize("cache_type", list(CACHES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("hq", "hk", "d", "window", "with_sinks"),
    [(4, 4, 64, None, False), (6, 2, 128, None, True), (7, 1, 256, 5, False), (4, 2, 64, 3, True)],
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


def test_contiguous_cache_prefill_uses_sdpa_semantics():
    """A uniform prefill on a dynamic cache equals plain causal SDPA."""
    q, k, v = (torch.randn(2, 4, 7, 32) for _ in range(3))
    cache = DynamicCache([4], [32], torch.float32)
    ids = cache.add_sequences(2)
    cache.begin_step(ids, [7, 7], 7)
    out = attention(q, cache.update(0, k, v), 32**-0.5)
    cache.end_step()
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
