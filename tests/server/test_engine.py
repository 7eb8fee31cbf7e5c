"""The engine core as the server drives it, without HTTP: one iteration at a time."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import ErrorKind, Event, SeqError, SeqSpec, Stats, Token
from pace_core.engine.runner import group_chunks, step_batch
from pace_core.engine.scheduler import plan_chunks
from pace_core.sampling.config import SamplingConfig

from .conftest import THREADS


@contextlib.contextmanager
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, events):
        self.events.extend(events)

    def tokens(self, key: str) -> list[int]:
        return [e.token for e in self.events if isinstance(e, Token) and e.key == key]

    def errors(self, key: str) -> list[SeqError]:
        return [e for e in self.events if isinstance(e, SeqError) and e.key == key]


def finish(core) -> None:
    """Iterate until the inbox is drained and nothing is queued or running."""
    core.run_once()
    while core.busy:
        core.run_once()


def _spec(llm, key, prompt, max_tokens, **kw):
    ids = llm.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else prompt
    cfg = SamplingConfig(max_new_tokens=max_tokens, ignore_eos=True, **kw)
    return SeqSpec(key, list(ids), cfg)


@pytest.fixture
def engine(llm):
    def make(**kw):
        rec = Recorder()
        core = EngineCore(llm.handle, EngineConfig(**kw), rec)
        return core, rec

    return make


def test_the_loop_keeps_loaded_objects_out_of_the_collector(engine):
    """While the engine loop runs, what was alive at its start is frozen (no full collection
    walks the loaded model again; handing it back: tests/engine/test_loading.py)."""
    core, _ = engine()
    frozen: list[int] = []
    real = core.run_once

    def one_iteration(block: bool = False) -> bool:
        frozen.append(gc.get_freeze_count())
        core.stop()
        return real(block=False)  # takes the stop

    core.run_once = one_iteration
    core.run()
    assert frozen and frozen[0] > 1000  # the model, torch, the test itself


def test_group_chunks_limits_padding():
    groups = group_chunks([("a", 100), ("b", 90), ("c", 10), ("d", 8)])
    assert [[k for k, _ in g] for g in groups] == [["a", "b"], ["c", "d"]]


def test_plan_chunks_takes_prompts_fifo_within_the_budget():
    assert plan_chunks([("a", 10), ("b", 30), ("c", 5)], 25) == [("a", 10), ("b", 15)]
    assert plan_chunks([("a", 10)], 0) == []


def test_step_batch_right_aligns_each_row():
    rows = [torch.tensor([7]), torch.tensor([8]), torch.tensor([5]), torch.tensor([1, 2, 3])]
    batch, counts = step_batch(rows)
    assert counts == [1, 1, 1, 3]
    assert batch.tolist() == [[0, 0, 7], [0, 0, 8], [0, 0, 5], [1, 2, 3]]
    batch, counts = step_batch([torch.tensor([4])])
    assert counts == [1] and batch.tolist() == [[4]]


def test_chunked_prefill_interleaves_with_decode(llm, engine):
    core, rec = engine(max_prefill_tokens=16)
    long_prompt = list(range(100, 170))  # 70 tokens: 5 chunks of <= 16
    with one_thread():
        core.submit([_spec(llm, "A", "Hello there", 30)])
        core.run_once()
        assert len(rec.tokens("A")) == 1
        core.submit([_spec(llm, "B", long_prompt, 4)])
        for i in range(5):
            core.run_once()
            # A decodes one token every iteration while B's prompt is prefilled in chunks
            assert len(rec.tokens("A")) == 2 + i
            assert len(rec.tokens("B")) == (1 if i == 4 else 0)
        assert core.cache.get_num_tokens(core.scheduler.running[1].seq_id) == 70
        while core.busy:
            core.run_once()
    assert len(rec.tokens("A")) == 30 and len(rec.tokens("B")) == 4
    assert core.cache.num_free_blocks == core.scheduler.num_blocks and core.scheduler.booked == 0


def test_admission_books_prompt_plus_max_tokens(llm, engine):
    core, _rec = engine(max_running=8)
    per_seq = core.capacity_tokens // 2 - 16  # two bookings fit, three do not
    with one_thread():
        core.submit([_spec(llm, k, "Hi", per_seq - 2) for k in ("A", "B", "C")])
        core.run_once()
        assert [s.spec.key for s in core.scheduler.running] == ["A", "B"]
        assert [s.spec.key for s in core.scheduler.waiting] == ["C"]
        assert core.scheduler.booked <= core.scheduler.num_blocks
        core.run_once()
        assert [s.spec.key for s in core.scheduler.waiting] == ["C"]  # still no room
        core.cancel(["A"])
        core.run_once()  # A leaves, its booking is released, C is admitted and prefilled
        assert [s.spec.key for s in core.scheduler.running] == ["B", "C"]
        core.cancel(["B", "C"])
        core.run_once()
    assert not core.busy and core.scheduler.booked == 0
    assert core.cache.num_free_blocks == core.scheduler.num_blocks


def test_max_running_caps_the_batch(llm, engine):
    core, rec = engine(max_running=2)
    with one_thread():
        core.submit([_spec(llm, str(i), "Hi", 3) for i in range(5)])
        core.run_once()
        assert len(core.scheduler.running) == 2 and len(core.scheduler.waiting) == 3
        while core.busy:
            core.run_once()
            assert len(core.scheduler.running) + len(core.scheduler.prefilling) <= 2
    assert all(len(rec.tokens(str(i))) == 3 for i in range(5))


def test_bad_request_fails_alone(llm, engine):
    core, rec = engine()
    bad = _spec(llm, "bad", "Hi", 3, logit_bias={10**7: 1.0})  # id outside the vocabulary
    with one_thread():
        core.submit([_spec(llm, "good", "Hi", 3), bad])
        finish(core)
    assert rec.errors("bad") and rec.errors("bad")[0].kind == ErrorKind.INVALID_REQUEST
    assert len(rec.tokens("good")) == 3
    assert core.scheduler.booked == 0 and core.cache.num_free_blocks == core.scheduler.num_blocks


def test_oversized_request_is_rejected(llm, engine):
    core, rec = engine()
    with one_thread():
        core.submit([_spec(llm, "big", "Hi", core.scheduler.num_blocks * core.block_size)])
        core.run_once()
    assert rec.errors("big")[0].kind == ErrorKind.INVALID_REQUEST and not core.busy


def test_stats_events(llm, engine):
    core, rec = engine()
    with one_thread():
        core.submit([_spec(llm, "A", "Hi", 2)])
        finish(core)
        core.run_once()  # idle: flushes the final stats
    stats = [e for e in rec.events if isinstance(e, Stats)]
    assert any(s.running == 1 and s.kv_used > 0 for s in stats)  # one running, some KV in use
    assert stats[-1] == Stats(0, 0, 0.0, 0.0)


def test_warm_up_measures_the_prefill_rate_and_leaves_the_cache_as_it_was(
    llm, engine, monkeypatch
):
    """Before serving, the pool is committed and throwaway prefills set the budget's rate
    (the fastest of the timed ones after a first: the first forward of a process is not
    measured); their blocks are freed and never indexed as a prefix."""
    from pace_core.engine import warm_up as warm

    core, rec = engine(max_prefill_tokens=256)
    core.cache.enable_prefix_caching(b"warm-up test")
    order = []
    core.cache.populate = lambda: order.append("populate") or 0  # its own test: tests/caches
    real_forward, real_record = warm.forward_step, core.prefill_budget.record
    monkeypatch.setattr(warm, "forward_step",
                        lambda *a, **k: (order.append("forward"), real_forward(*a, **k))[1])
    core.prefill_budget.record = lambda *a: (order.append(("record", a[0])), real_record(*a))[1]
    with one_thread():
        rate = core.warm_up()
        assert rate is not None and rate > 0 and core.prefill_budget.rate == rate
        forwards = ["forward"] * (1 + warm.MEASURED_FORWARDS)
        assert order == ["populate", *forwards, ("record", warm.WARM_UP_TOKENS)]
        assert core.cache.num_free_blocks == core.scheduler.num_blocks
        ids = (torch.arange(warm.WARM_UP_TOKENS) % llm.model.vocab_size).tolist()
        assert core.cache.cached_prefix_tokens(ids) == 0
        assert core.steps == 0 and not rec.events
        core.submit([_spec(llm, "A", "Hello there", 4)])
        finish(core)
    assert len(rec.tokens("A")) == 4


def test_warm_up_skips_a_context_too_short_to_measure_a_rate(llm, engine):
    core, _ = engine(max_prefill_tokens=64)
    core.max_context = 40  # a model this short: 39 tokens, under the 64 a rate needs
    assert core.warm_up() is None and core.prefill_budget.rate is None
    assert core.cache.num_free_blocks == core.scheduler.num_blocks


def test_prefill_is_sliced_while_sequences_decode(llm, engine):
    core, rec = engine(max_prefill_tokens=64, prefill_slice_ms=10)
    core.prefill_budget.rate = 2000.0  # tokens/s: a 10 ms slice is 20 tokens
    core.prefill_budget.record = lambda *args: None  # keep the rate fixed
    long_prompt = list(range(100, 170))  # 70 tokens: 20 + 20 + 20 + 10 while A decodes
    with one_thread():
        core.submit([_spec(llm, "A", "Hello there", 30)])
        core.run_once()  # nothing decodes yet: A's prompt in one chunk
        core.submit([_spec(llm, "B", long_prompt, 4)])
        done = []
        for _ in range(4):
            core.run_once()
            sched = core.scheduler
            done.append(next(s.computed for s in [*sched.prefilling, *sched.running]
                             if s.spec.key == "B"))  # fmt: skip
        assert done == [20, 40, 60, 70]
        assert len(rec.tokens("A")) == 5  # one token per iteration, never stalled
        finish(core)
    assert len(rec.tokens("A")) == 30 and len(rec.tokens("B")) == 4
    assert core.cache.num_free_blocks == core.scheduler.num_blocks and core.scheduler.booked == 0


def test_mixed_steps_give_the_separate_forwards_tokens(llm, engine, monkeypatch):
    """Decodes and prompt chunks in one packed forward per iteration (the fused stack packs
    ragged steps): the same greedy tokens as separate prefill and decode forwards, one forward
    per iteration, and every block back in the pool."""
    import pace_core.engine.runner as engine_module

    if not llm.model.packs_ragged_steps:
        pytest.skip("the resolved decoder_stack does not pack ragged steps (no AVX-512 here)")
    forwards = []
    real_forward_step = engine_module.forward_step

    def counting(*args, **kw):
        forwards.append(list(args[4]))  # num_new per row
        return real_forward_step(*args, **kw)

    monkeypatch.setattr(engine_module, "forward_step", counting)
    prompts = {"A": "Hello there", "B": list(range(100, 170)), "C": "The capital of France is"}
    results = {}
    for mixed in (True, False):
        core, rec = engine(max_prefill_tokens=24, prefill_slice_ms=0)
        assert core.runner.one_forward
        core.runner.one_forward = mixed
        forwards.clear()
        with one_thread():
            core.submit([_spec(llm, "A", prompts["A"], 12)])
            core.run_once()
            core.submit([_spec(llm, k, prompts[k], 6) for k in ("B", "C")])
            iterations = 1
            while core.busy:
                core.run_once()
                iterations += 1
        results[mixed] = {k: rec.tokens(k) for k in prompts}
        if mixed:
            assert len(forwards) == iterations  # one forward per iteration
            assert any(1 in rows and max(rows) > 1 for rows in forwards)  # decodes + chunks
        sched = core.scheduler
        assert core.cache.num_free_blocks == sched.num_blocks and sched.booked == 0
    assert results[True] == results[False]
    assert [len(results[True][k]) for k in "ABC"] == [12, 6, 6]
