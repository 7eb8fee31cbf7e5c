"""What ``LLMModel.generate`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pace_core.speculative.stats import SpecStats


@dataclass
class TokenLogprob:
    """The chosen token's logprob and the top-k alternatives (id → logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class SequenceOutput:
    """One generated sequence."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    spec_stats: SpecStats | None = None  # speculative decoding counters of this sequence


@dataclass
class GenerationOutput:
    """Batch result: ``output_token_ids`` is ``[B, prompt + new]`` like HF's ``generate``.

    Prompts keep their (left) padding; shorter generations are right-padded with ``pad_token_id``.
    """

    output_token_ids: torch.Tensor
    sequences: list[SequenceOutput]
    logits: list[torch.Tensor] | None = None  # per row: [new_tokens, V] raw logits
    spec_stats: SpecStats | None = None  # speculative decoding counters of the whole batch

    @property
    def generated_token_ids(self) -> list[list[int]]:
        return [s.token_ids for s in self.sequences]

    @property
    def texts(self) -> list[str | None]:
        return [s.text for s in self.sequences]

    @property
    def finish_reasons(self) -> list[str]:
        return [s.finish_reason for s in self.sequences]
