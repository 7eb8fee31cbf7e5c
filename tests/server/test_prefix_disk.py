"""``pace serve --prefix-cache-dir``: a restarted server answers a long shared system prompt
from the blocks its predecessor left on disk, with the same output."""

from __future__ import annotations

import torch

from pace_core.engine.llm import LLMModel

from .conftest import CACHE_TOKENS, MODEL_NAME, client, serve

SYSTEM = " ".join(f"Rule {i}: answer politely about item {i}." for i in range(60))
ASK = {
    "model": MODEL_NAME,
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Rule 3?"}],
    "max_tokens": 12,
    "temperature": 0,
}


def answer(smollm2_dir, cache_dir):
    """A fresh model and server (a restart): the answer and the prompt tokens it took from
    the prefix cache; the server is stopped (its blocks spilled) before returning."""
    llm = LLMModel(
        smollm2_dir, dtype=torch.float32, max_cache_tokens=CACHE_TOKENS, quiet=True,
        prefix_cache_dir=cache_dir,
    )  # fmt: skip
    with serve(llm) as http:
        res = client(http).chat.completions.create(**ASK)
    details = res.usage.prompt_tokens_details
    return res.choices[0].message.content, res.usage.prompt_tokens, details.cached_tokens


def test_a_restarted_server_reuses_the_prompt_blocks_on_disk(smollm2_dir, tmp_path):
    cold, prompt_tokens, cold_cached = answer(smollm2_dir, tmp_path)
    assert prompt_tokens > 640 and cold_cached == 0
    assert list(tmp_path.glob("*/*.safetensors")), "the stopped server left no blocks on disk"
    warm, _, cached = answer(smollm2_dir, tmp_path)
    assert warm == cold
    assert cached == (prompt_tokens - 1) // 64 * 64  # every full block but the last token's
