"""The scheduler with no model: a real block pool (and a contiguous cache), a fake runner
that only writes KV, and the admission, booking, chunking, prefix and release rules."""

from __future__ import annotations

import torch

from pace_core.caches.blocks import PagedCache
from pace_core.caches.contiguous import DynamicCache
from pace_core.engine.events import SeqSpec
from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.engine.scheduler import Request, Scheduler
from pace_core.sampling.config import SamplingConfig

BLOCK = 4
LAYERS, HEADS, DIM = 2, 1, 4


def paged(tokens: int = 64, caching: bool = False) -> PagedCache:
    cache = PagedCache([HEADS] * LAYERS, [DIM] * LAYERS, torch.float32, block_size=BLOCK,
                       max_tokens=tokens)  # fmt: skip
    if caching:
        cache.enable_prefix_caching(b"test")
    return cache


def spec(key: str, prompt: list[int], new: int = 4) -> SeqSpec:
    return SeqSpec(key, prompt, SamplingConfig(max_new_tokens=new))


def scheduler(cache, max_running: int = 8, budget: int = 512) -> Scheduler:
    return Scheduler(cache, max_running, PrefillBudget(budget, 0.0))


def prepare(req: Request) -> None:
    """What a core builds per admitted sequence (its sampler row); nothing here."""


def run_step(sched: Scheduler, chunks: list[tuple[Request, int]]) -> None:
    """The fake runner: one step writing zeros for each running sequence's next token and
    each chunk, then the sequences whose prompt completed start decoding."""
    rows = [(r.seq_id, 1) for r in sched.running] + [(r.seq_id, n) for r, n in chunks]
    if not rows:
        return
    width = max(n for _, n in rows)
    cache = sched.cache
    cache.begin_step([s for s, _ in rows], [n for _, n in rows], width)
    for layer in range(LAYERS):
        kv = torch.zeros(len(rows), HEADS, width, DIM)
        cache.update(layer, kv, kv)
    cache.end_step()
    done = sched.advance(chunks)
    sched.join([chunks[i][0] for i in done])


def test_fifo_admission_books_prompt_plus_max_tokens():
    sched = scheduler(paged(64))  # 16 blocks
    for key in "ABC":
        assert sched.add(spec(key, list(range(20)), new=8)) is None  # 28 tokens: 7 blocks
    admitted, failed = sched.admit(prepare)
    assert [r.key for r in admitted] == ["A", "B"] and not failed
    assert sched.booked == 14 and [r.key for r in sched.waiting] == ["C"]
    run_step(sched, sched.chunks())
    assert [r.key for r in sched.running] == ["A", "B"]
    keep = sched.finish([0])  # A leaves: its booking and blocks go back
    assert keep == [1] and sched.booked == 7
    admitted, _ = sched.admit(prepare)
    assert [r.key for r in admitted] == ["C"]
    sched.finish([0])
    run_step(sched, sched.chunks())
    sched.finish([0])
    assert not sched.busy and sched.booked == 0
    assert sched.cache.num_free_blocks == sched.num_blocks


def test_a_request_larger_than_the_pool_is_refused_up_front():
    sched = scheduler(paged(64))
    problem = sched.add(spec("big", list(range(60)), new=8))
    assert "68 tokens" in problem and "holds 64" in problem and not sched.waiting


def test_max_running_and_failed_preparation():
    sched = scheduler(paged(256), max_running=2)
    for key in "ABC":
        sched.add(spec(key, [1, 2, 3]))

    def picky(req: Request) -> None:
        if req.key == "A":
            raise ValueError("bad top_p")
        prepare(req)

    admitted, failed = sched.admit(picky)
    assert [r.key for r in admitted] == ["B", "C"] and [r.key for r in failed] == ["A"]
    assert isinstance(failed[0].error, ValueError) and sched.booked == 4  # 2 x (3 + 4 tokens)


def test_prompt_chunks_follow_the_budget_fifo():
    sched = scheduler(paged(256), budget=10)
    sched.add(spec("A", list(range(14))))
    sched.add(spec("B", list(range(6))))
    sched.admit(prepare)
    assert [(r.key, n) for r, n in sched.chunks()] == [("A", 10)]
    run_step(sched, sched.chunks())
    assert [(r.key, n) for r, n in sched.chunks()] == [("A", 4), ("B", 6)]
    run_step(sched, sched.chunks())
    assert [r.key for r in sched.running] == ["A", "B"] and not sched.prefilling


def test_a_shared_prefix_is_computed_once():
    """B shares A's first two blocks: it waits while A prefills them, then adopts them."""
    sched = Scheduler(paged(256, caching=True), 8, PrefillBudget(64, 0.0), None, True)
    shared = list(range(100, 108))  # two full blocks
    sched.add(spec("A", [*shared, 1, 2, 3]))
    sched.add(spec("B", [*shared, 7, 8, 9]))
    sched.add(spec("C", [50, 51, 52, 53, 54]))  # queued behind B (FIFO)
    admitted, _ = sched.admit(prepare)
    assert [r.key for r in admitted] == ["A"] and [r.key for r in sched.waiting] == ["B", "C"]
    run_step(sched, sched.chunks())  # A's prompt written: its full blocks indexed
    admitted, _ = sched.admit(prepare)
    assert [(r.key, r.computed) for r in admitted] == [("B", 8), ("C", 0)]
    assert [(r.key, n) for r, n in sched.chunks()] == [("B", 3), ("C", 5)]


def test_cancel_waiting_prefilling_and_running():
    sched = scheduler(paged(256), budget=4)
    for key in "ABCD":
        sched.add(spec(key, list(range(6))))
    sched.admit(prepare)
    run_step(sched, sched.chunks())  # A: 4 of 6 tokens
    run_step(sched, sched.chunks())  # A done, B: 2 of 6
    assert [r.key for r in sched.running] == ["A"]
    sched.add(spec("E", [1]))
    rows = sched.cancel({"A", "B", "E"})
    assert rows == [0]  # A runs: the caller retires its row
    sched.finish(rows)
    assert [r.key for r in sched.prefilling] == ["C", "D"] and not sched.waiting
    assert sched.booked == 2 * 3  # C and D: 10 tokens = 3 blocks each


def test_a_contiguous_cache_runs_whole_batches():
    cache = DynamicCache([HEADS] * LAYERS, [DIM] * LAYERS, torch.float32)
    sched = scheduler(cache, max_running=2, budget=2)
    for key, n in (("A", 5), ("B", 3), ("C", 4)):
        sched.add(spec(key, list(range(n))))
    admitted, _ = sched.admit(prepare)
    assert [r.key for r in admitted] == ["A", "B"] and sched.capacity_tokens is None
    assert cache.capacity >= 9  # room for the batch's longest sequence, up front
    chunks = sched.chunks()
    assert [(r.key, n) for r, n in chunks] == [("A", 5), ("B", 3)]  # whole prompts
    assert sched.admit(prepare) == ([], [])  # the next batch waits for this one
    run_step(sched, chunks)
    sched.finish([0])  # A leaves: B is renumbered to row 0
    assert sched.running[0].seq_id == 0 and cache.batch == 1
    run_step(sched, [])
    assert cache.get_num_tokens(0) == 4
    sched.finish([0])
    admitted, _ = sched.admit(prepare)
    assert [(r.key, r.seq_id) for r in admitted] == [("C", 0)]
