"""Per-sequence bookkeeping during generation: tokens, text, stop strings, logprobs."""

from __future__ import annotations

from typing import Any

from pace_core.engine.detokenize import IncrementalDetokenizer
from pace_core.engine.output import TokenLogprob
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.stop import StopChecker


class SequenceTracker:
    """Follows one sequence: decides when it finishes and what text it has released."""

    def __init__(
        self,
        config: SamplingConfig,
        prompt_len: int,
        tokenizer: Any | None,
        max_context: int | None,
    ) -> None:
        self.config = config
        self.prompt_len = prompt_len
        self.max_context = max_context
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.stop = StopChecker(config.stop) if self.detok is not None else None

    def add(self, token: int, hit_eos: bool, hit_length: bool) -> str:
        """Record ``token``; return the text it releases. Sets ``finish_reason`` when done."""
        self.tokens.append(token)
        delta = ""
        if self.detok is not None and self.stop is not None:
            update = self.stop.feed(self.detok.add(token))
            delta = update.text
            if update.stopped:
                self.finish_reason = "stop"
                return delta
        if hit_eos:
            self.finish_reason = "stop"
        elif hit_length or (
            self.max_context is not None and self.prompt_len + len(self.tokens) >= self.max_context
        ):
            self.finish_reason = "length"
        if self.finish_reason is not None and self.stop is not None and not self.stop.stopped:
            delta += self.stop.feed(self.detok.flush()).text + self.stop.flush()
        return delta

    @property
    def text(self) -> str | None:
        return self.stop.output if self.stop is not None else None
