"""Generation behaviour on a tiny random model: batching, finishing, seeds, logprobs, streams."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from pace_core import LLMModel, SamplingConfig


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()


def test_output_shapes_and_padding(tiny):
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = tiny.generate(
        {"input_ids": ids, "attention_mask": mask},
        SamplingConfig(max_new_tokens=5, ignore_eos=True),
    )
    assert out.output_token_ids.shape == (2, 9)
    assert torch.equal(out.output_token_ids[:, :4], ids)
    assert out.sequences[0].prompt_token_ids == [5, 6]
    assert out.finish_reasons == ["length", "length"]
    assert [len(t) for t in out.generated_token_ids] == [5, 5]


def test_eos_stops_row_and_others_continue(tiny, hf):
    prompt = torch.tensor([[5, 6, 7]])
    free = tiny.generate(prompt, SamplingConfig(max_new_tokens=8, ignore_eos=True))
    eos = free.sequences[0].token_ids[2]  # make the 3rd generated token the EOS
    cfg = SamplingConfig(max_new_tokens=8, eos_token_id=eos)
    out = tiny.generate(torch.tensor([[5, 6, 7], [9, 9, 9]]), cfg)
    first = out.sequences[0]
    assert first.finish_reason == "stop" and first.token_ids == free.sequences[0].token_ids[:3]
    other = tiny.generate(torch.tensor([[9, 9, 9]]), cfg).sequences[0]
    assert out.sequences[1].token_ids == other.token_ids
    # padding after an early stop uses the pad id; the finished row cost no more forwards
    assert out.output_token_ids.shape[1] == 3 + max(len(first.token_ids), len(other.token_ids))


def test_min_new_tokens_and_multiple_eos(tiny):
    prompt = torch.tensor([[5, 6, 7]])
    free = tiny.generate(prompt, SamplingConfig(max_new_tokens=6, ignore_eos=True)).sequences[0]
    eos = [free.token_ids[0], free.token_ids[1]]
    assert (
        tiny.generate(prompt, SamplingConfig(max_new_tokens=6, eos_token_id=eos))
        .sequences[0]
        .token_ids
        == eos[:1]
    )
    out = tiny.generate(
        prompt, SamplingConfig(max_new_tokens=6, eos_token_id=eos, min_new_tokens=3)
    )
    assert len(out.sequences[0].token_ids) >= 3
    assert not set(out.sequences[0].token_ids[:2]) & set(eos)


def test_seeded_sampling_reproducible_and_independent(tiny):
    prompt = torch.tensor([[5, 6, 7]])
    cfg = SamplingConfig(
        max_new_tokens=12, do_sample=True, temperature=1.5, seed=123, ignore_eos=True
    )
    state = torch.get_rng_state()
    a = tiny.generate(prompt, cfg).sequences[0].token_ids
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is never touched
    b = tiny.generate(prompt, cfg).sequences[0].token_ids
    assert a == b
    other = cfg.merged(seed=7)
    both = tiny.generate(torch.tensor([[5, 6, 7], [5, 6, 7]]), [cfg, other])
    assert both.sequences[0].token_ids == a
    assert both.sequences[1].token_ids == tiny.generate(prompt, other).sequences[0].token_ids
    assert both.sequences[1].token_ids != a


def test_logits_and_logprobs_match_hf(tiny, hf):
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = tiny.generate(
        prompt, SamplingConfig(max_new_tokens=6, min_new_tokens=6, logprobs=3), output_logits=True
    )
    ref = hf.generate(
        prompt,
        do_sample=False,
        max_new_tokens=6,
        min_new_tokens=6,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.sequences[0].token_ids == ref.sequences[0, 4:].tolist()
    ref_logits = torch.cat(ref.logits)
    assert torch.allclose(out.logits[0], ref_logits, atol=1e-4)
    lp = torch.log_softmax(ref_logits, dim=-1)
    for t, entry in enumerate(out.sequences[0].logprobs):
        assert entry.logprob == pytest.approx(float(lp[t, entry.token_id]), abs=1e-4)
        assert list(entry.top) == lp[t].topk(3).indices.tolist()


def test_prompt_logprobs(tiny, hf):
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = tiny.generate(prompt, SamplingConfig(max_new_tokens=1, prompt_logprobs=2))
    entries = out.sequences[0].prompt_logprobs
    assert entries[0] is None and len(entries) == 4
    with torch.no_grad():
        lp = torch.log_softmax(hf(prompt).logits[0], dim=-1)
    for t in range(1, 4):
        assert entries[t].logprob == pytest.approx(float(lp[t - 1, prompt[0, t]]), abs=1e-4)
        assert len(entries[t].top) == 2


def test_prompt_logprobs_scored_across_prefill_chunks(tiny, hf):
    """The core scores a prompt in its own prefill: 3-token chunks here (the last one short),
    each position the next token as one whole-prompt forward does, top alternatives included,
    and the scores leave before the sequence's first token."""
    from pace_core.engine.config import EngineConfig
    from pace_core.engine.core import EngineCore
    from pace_core.engine.events import PromptLogprobs, SeqSpec, Token

    prompt = torch.tensor([9, 4, 33, 7, 101, 2, 64, 5])
    with torch.no_grad():
        lp = torch.log_softmax(hf(prompt.view(1, -1)).logits[0], dim=-1)
    config = EngineConfig(max_prefill_tokens=3, prefill_slice_ms=0.0)
    core = EngineCore(tiny.handle, config, cache=tiny.new_cache(), offline=True)
    cfg = SamplingConfig(max_new_tokens=2, prompt_logprobs=2)
    core.submit([SeqSpec("0", prompt.tolist(), cfg)])
    events = [ev for batch in core.drive() for ev in batch]
    kinds = [type(ev) for ev in events if isinstance(ev, PromptLogprobs | Token)]
    assert kinds == [PromptLogprobs, Token, Token]
    (entries,) = [ev.entries for ev in events if isinstance(ev, PromptLogprobs)]
    assert entries[0] is None and len(entries) == prompt.numel()
    for t in range(1, prompt.numel()):
        assert entries[t].token_id == int(prompt[t])
        assert entries[t].logprob == pytest.approx(float(lp[t - 1, prompt[t]]), abs=1e-4)
        assert list(entries[t].top) == lp[t - 1].topk(2).indices.tolist()


def test_prompt_scorer_holds_a_few_positions_of_logits_at_once(tiny, hf):
    """PromptScorer's own chunks (2 positions) of a 5-position prefill give the same scores."""
    from pace_core.engine.prompt_logprobs import PromptScorer
    from pace_core.models.decoder import hidden_step

    prompt = torch.tensor([3, 17, 40, 8, 99])
    cache = tiny.new_cache()
    (seq,) = cache.add_sequences(1)
    with torch.no_grad():
        hidden = hidden_step(tiny.model, cache, [seq], prompt.view(1, -1), [5])[0]
        lp = torch.log_softmax(hf(prompt.view(1, -1)).logits[0], dim=-1)
    scorer = PromptScorer(prompt, 1, chunk_tokens=2)
    scorer.add(tiny.model.head, hidden[:3], 0)
    scorer.add(tiny.model.head, hidden[3:], 3)  # the last position scores nothing
    assert [e.token_id for e in scorer.entries[1:]] == prompt[1:].tolist()
    for t in range(1, 5):
        assert scorer.entries[t].logprob == pytest.approx(float(lp[t - 1, prompt[t]]), abs=1e-4)


def test_streamer_protocol(tiny):
    class Recorder:
        def __init__(self):
            self.calls, self.ended = [], False

        def put(self, value):
            self.calls.append(value.tolist())

        def end(self):
            self.ended = True

    rec = Recorder()
    out = tiny.generate(
        torch.tensor([[5, 6, 7]]), SamplingConfig(max_new_tokens=4, ignore_eos=True), streamer=rec
    )
    assert rec.calls[0] == [[5, 6, 7]] and rec.ended
    assert [c[0] for c in rec.calls[1:]] == out.sequences[0].token_ids


def test_stream_iterator_matches_generate(tiny):
    cfg = SamplingConfig(max_new_tokens=5, ignore_eos=True)
    chunks = list(tiny.stream(torch.tensor([[5, 6, 7], [1, 2, 3]]), cfg))
    out = tiny.generate(torch.tensor([[5, 6, 7], [1, 2, 3]]), cfg)
    for row in (0, 1):
        assert [c.token_id for c in chunks if c.index == row] == out.sequences[row].token_ids
        assert [c.finish_reason for c in chunks if c.index == row][-1] == "length"


@pytest.mark.parametrize("kv_cache_type", ["paged", "slab_pool", "dynamic"])
def test_more_prompts_than_the_pool_holds_stream_through_it(
    tiny_llama_dir, kv_cache_type, monkeypatch
):
    """A call's prompts go through the engine core with a bounded running set: 40 prompts
    of 20-40 tokens (~1,500 tokens with their budgets) through a 128-token pool finish, each
    with the greedy tokens it gets alone; the pool is empty again after."""
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "16")
    monkeypatch.setenv("PACE_SLAB_BLOCK_TOKENS", "16")
    pool = {} if kv_cache_type == "dynamic" else {"max_cache_tokens": 128}  # (it grows)
    llm = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                   kv_cache_type=kv_cache_type, **pool)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(20, 41, (40,), generator=gen).tolist()
    prompts = [torch.randint(4, 128, (n,), generator=gen) for n in sizes]
    cfg = SamplingConfig(max_new_tokens=6, ignore_eos=True)
    together = llm.generate(prompts, cfg).generated_token_ids
    alone = [llm.generate(p[None], cfg).generated_token_ids[0] for p in prompts[:8]]
    assert together[:8] == alone and all(len(t) == 6 for t in together)
    if kv_cache_type != "dynamic":
        cache = llm.generation_cache()
        assert cache.num_blocks == 8 and cache.num_free_blocks == cache.num_blocks


def test_a_sequence_larger_than_the_pool_is_refused_with_the_fix(tiny_llama_dir, monkeypatch):
    from pace_core.errors import ConfigError

    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "16")
    llm = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                   max_cache_tokens=32)  # fmt: skip
    too_large = r"prompt 1: .*needs 40 tokens.*holds 32.*max_cache_tokens"
    with pytest.raises(ConfigError, match=too_large):
        llm.generate([torch.arange(5, 10), torch.arange(5, 25)], SamplingConfig(max_new_tokens=20))


def test_prompts_sharing_an_instruction_compute_it_once(tiny_llama_dir, monkeypatch):
    """Prefix caching inside one call: the shared instruction's blocks are computed for the
    first prompt and adopted by the others (which wait for them), outputs unchanged."""
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "16")
    llm = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)
    instruction = torch.arange(10, 50)  # 2 full blocks and a half
    prompts = [torch.cat([instruction, torch.tensor([60 + i, 6, 7])]) for i in range(6)]
    cfg = SamplingConfig(max_new_tokens=4, ignore_eos=True)
    out = llm.generate(prompts, cfg).generated_token_ids
    cache = llm.generation_cache()
    assert cache.prefix_hits == 5 * 32  # every later prompt adopted the 2 full blocks
    plain = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                     prefix_caching=False)  # fmt: skip
    assert out == plain.generate(prompts, cfg).generated_token_ids


def test_the_engine_knobs_of_generate(tiny_llama_dir):
    """``engine_config`` sets how many sequences generate runs at once and its prompt tokens
    per step; outputs do not depend on them (fp32); a wrong type is refused."""
    from pace_core.engine.config import EngineConfig
    from pace_core.errors import ConfigError

    prompts = [torch.arange(5 + i, 30 + 2 * i) % 120 + 4 for i in range(5)]
    cfg = SamplingConfig(max_new_tokens=5, ignore_eos=True)
    small = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                     engine_config=EngineConfig(max_running=2, max_prefill_tokens=8))  # fmt: skip
    plain = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)
    assert small.generate(prompts, cfg).generated_token_ids == plain.generate(
        prompts, cfg
    ).generated_token_ids
    with pytest.raises(ConfigError, match="engine_config must be"):
        LLMModel(tiny_llama_dir, load_tokenizer=False, engine_config={"max_running": 2})
