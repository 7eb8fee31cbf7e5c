"""What ``LLMModel.generate`` and ``stream`` return, built from the engine core's events.

The core runs the offline call like any other (:data:`OFFLINE_ENGINE` knobs); this module
gathers each sequence's tokens, text, logprobs, logits and speculative counters
(:class:`SequenceCollector`) and packs ``output_token_ids`` the way
transformers' ``generate`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import PromptLogprobs, SpecStep, Token
from pace_core.engine.output import GenerationOutput, SequenceOutput, TokenLogprob
from pace_core.engine.speculative import SpecDecoder
from pace_core.models.decoder import left_pad
from pace_core.sampling.config import SamplingConfig
from pace_core.speculative.stats import SpecStats

OFFLINE_ENGINE = EngineConfig(
    max_running=64, max_prefill_tokens=2048, prefill_slice_ms=0.0, wait_for_shared_prefix=True
)
"""The core's knobs for ``generate`` / ``stream``: up to 64 sequences at once (as the KV pool
allows), 2048 prompt tokens per step on top of the decodes (no latency slice: throughput)."""


@dataclass
class OfflineRun:
    """One call's sequences going through an :class:`EngineCore` (keys: ``str(index)``)."""

    prompts: list[torch.Tensor]
    padded: torch.Tensor | None  # the caller's padded input_ids, if any
    configs: list[SamplingConfig]
    core: EngineCore


@dataclass
class StreamChunk:
    """One token of one sequence, as yielded by ``LLMModel.stream``."""

    index: int
    token_id: int
    text: str
    finish_reason: str | None


SEQUENCE_EVENTS = (Token, SpecStep, PromptLogprobs)
"""The core's events that belong to one offline sequence (:class:`SequenceCollector`)."""


class SequenceCollector:
    """What ``generate`` gathers of one sequence from the core's events."""

    def __init__(self, config: SamplingConfig, has_text: bool) -> None:
        self.config = config
        self.tokens: list[int] = []
        self.text: str | None = "" if has_text else None
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []
        self.logits: list[torch.Tensor] = []
        self.spec = SpecStats()
        self.prompt_logprobs: list[TokenLogprob | None] | None = None

    def add(self, ev: Token | SpecStep | PromptLogprobs) -> None:
        """Take one of the sequence's events (:data:`SEQUENCE_EVENTS`)."""
        if isinstance(ev, PromptLogprobs):
            self.prompt_logprobs = ev.entries
            return
        if isinstance(ev, SpecStep):
            self.spec.record(ev.proposed, ev.accepted, ev.emitted)
            return
        self.tokens.append(ev.token)
        if self.text is not None:
            self.text += ev.text
        self.finish_reason = ev.finish_reason
        if ev.logits is not None:
            self.logits.append(ev.logits)
        if self.config.logprobs is not None and ev.logprob is not None:
            top = {}
            if ev.top_ids is not None:
                top = {i: v for i, v in zip(ev.top_ids, ev.top_logprobs) if i >= 0}
            self.logprobs.append(TokenLogprob(ev.token, float(ev.logprob), top))


def pack_tokens(
    prompts: Sequence[torch.Tensor],
    padded: torch.Tensor | None,
    generated: Sequence[Sequence[int]],
    pad: int,
) -> torch.Tensor:
    """``[B, prompt + new]`` as transformers' ``generate`` returns it: the (left-padded)
    prompts, then each row's new tokens, right-padded with ``pad``."""
    if padded is None:
        padded = left_pad(prompts, pad)[0]
    width = max(len(g) for g in generated)
    tail = torch.full((len(prompts), width), pad, dtype=torch.long)
    for i, g in enumerate(generated):
        tail[i, : len(g)] = torch.tensor(list(g), dtype=torch.long)
    return torch.cat([padded, tail], dim=1)


def spec_totals(rows: Sequence[SequenceCollector], spec: SpecDecoder | None) -> SpecStats | None:
    """The call's speculative counters and timings (None without speculative decoding)."""
    if spec is None:
        return None
    stats = SpecStats.total(r.spec for r in rows)
    stats.draft_seconds = spec.draft_seconds
    stats.verify_seconds = spec.verify_seconds
    return stats


def generation_output(
    run: OfflineRun,
    rows: Sequence[SequenceCollector],
    pad: int,
    output_logits: bool,
    spec: SpecStats | None,
) -> GenerationOutput:
    """``generate``'s result from what was collected of each sequence."""
    sequences = [
        SequenceOutput(
            p.tolist(),
            r.tokens,
            r.text,
            r.finish_reason or "length",
            r.logprobs if r.config.logprobs is not None else None,
            r.prompt_logprobs,
            r.spec if spec is not None else None,
        )
        for p, r in zip(run.prompts, rows)
    ]
    logits = [torch.stack(r.logits) for r in rows] if output_logits else None
    tokens = pack_tokens(run.prompts, run.padded, [r.tokens for r in rows], pad)
    return GenerationOutput(tokens, sequences, logits, spec)
