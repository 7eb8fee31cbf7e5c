"""Offline generation through the engine core, bf16: prompts of different lengths batched
together give what each gives alone, token by token a near-tie choice of the prompt run alone
(bf16 kernels round differently for different row counts; fp32's exact equality is
tests/engine/test_generate.py's)."""

from __future__ import annotations

import torch
from support.parity import topk_rule_ok

from pace_core import LLMModel, SamplingConfig

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about rain.", "Count from one to five.",
    "Explain photosynthesis to a child in two sentences.", "Name three colours.",
    "Why is the sky blue? Answer briefly, then give one more fact about light.",
    "Hi", "List the planets of the solar system in order from the sun.",
]  # fmt: skip
CHATS = [[{"role": "user", "content": q}] for q in QUESTIONS]
GREEDY = SamplingConfig(max_new_tokens=16)


def test_batched_bf16_prompts_answer_as_they_do_alone(smollm2_dir):
    llm = LLMModel(smollm2_dir, dtype=torch.bfloat16, prefix_caching=False, quiet=True)
    together = llm.generate(CHATS, GREEDY).sequences
    alone = [llm.generate([chat], GREEDY).sequences[0] for chat in CHATS]
    for seq, single in zip(together, alone):
        assert seq.prompt_token_ids == single.prompt_token_ids
        ids = torch.tensor([seq.prompt_token_ids + seq.token_ids])
        ref = llm.logits(ids)[0]  # one sequence alone, teacher-forced on the batched tokens
        start = len(seq.prompt_token_ids) - 1
        bad = [t for t, tok in enumerate(seq.token_ids) if not topk_rule_ok(ref[start + t], tok)]
        assert not bad, f"{QUESTIONS[together.index(seq)]!r}: tokens {bad} are not near-ties"
