"""``pace bench offline`` / ``quantized``: how pace's decode rate is clocked (``PaceRunner``)."""

from __future__ import annotations

import argparse
import itertools
import time

import pytest
import torch
from pace_bench.offline import PaceRunner, measure_point

from pace_core.engine.offline import StreamChunk


class NoisyPrefillModel:
    """A stand-in ``LLMModel.stream``: a prefill whose length swings between calls (0.05 or
    0.4 s, as a shared host's long prefills do), then every row's first token, then one token
    per row every 10 ms."""

    def __init__(self) -> None:
        self.prefills = itertools.cycle([0.05, 0.4, 0.05, 0.4, 0.4])

    def stream(self, ids: torch.Tensor, config):
        rows = ids.shape[0]
        time.sleep(next(self.prefills))
        for row in range(rows):
            yield StreamChunk(row, 1, "", None)
        for _ in range(config.max_new_tokens - 1):
            time.sleep(0.01)
            for row in range(rows):
                yield StreamChunk(row, 1, "", None)


def test_pace_decode_is_clocked_inside_each_run():
    """Two rows, 10 tokens each: 18 tokens after both firsts over the 90 ms after them, ~200
    tok/s, whatever the prefill did; the old rate (tokens after the first over the whole run
    less the TTFT run) swung with the prefill by several times."""
    model = NoisyPrefillModel()
    ids = torch.zeros(2, 8, dtype=torch.long)
    engines = {"pace": lambda ids, n: PaceRunner(model, ids, n)}
    out = measure_point(engines, ids, argparse.Namespace(new_tokens=10, repeats=3))["pace"]
    assert out["decode_tok_s"] == pytest.approx(200, rel=0.25)
    runner = PaceRunner(model, ids, 10)
    runner()
    runner()
    assert len(runner.decode_rates) == 2
    one_token = PaceRunner(model, ids, 1)
    one_token()
    assert one_token.decode_rates == []  # nothing after the first tokens: no rate
