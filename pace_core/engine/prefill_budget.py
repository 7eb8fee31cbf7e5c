"""How many prompt tokens one scheduler iteration may prefill.

A prefill chunk runs in the same iteration as the running sequences' decode step, so every
running sequence waits for it: a 512-token chunk adds hundreds of milliseconds to the time
between two of their tokens. :class:`PrefillBudget` keeps that wait short. With nothing
decoding, an iteration prefills up to ``max_tokens`` (fastest time to first token); while
sequences decode, it prefills about ``slice_ms`` of prefill work on top of their decode,
converted to tokens at the measured *prefill rate*. ``slice_ms = 0`` turns the slicing off
(always ``max_tokens``).

The rate is the cost of one more prompt token in a forward, not a forward's average: every
forward also pays a fixed part (each weight read once, the LM head of its logits rows), and
a mixed forward's average rate counts that part against its few prompt tokens. A budget set
from the average is self-confirming: small chunks, a low rate, small chunks again (Gemma-3-270M
settled at 16-token chunks, a third of its prefill speed). So the rate comes from forwards that
prefill alone with at least ``rate_min_tokens`` tokens, where the fixed part is amortized (an
exponential average; slightly under the marginal rate, so the slice errs short). The engine
measures such forwards before it serves (``EngineCore.warm_up``: the fastest of two, after
a first one that pays the process's one-time costs); until a rate is known, the average rate
of the mixed forwards stands in.
"""

from __future__ import annotations

from pace_core.errors import ConfigError

_SMOOTHING = 0.3  # weight of the newest measurement in the rate averages
RATE_MIN_TOKENS = 64
"""A prefill-only forward measures the prefill rate from this many prompt tokens up."""


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new


class PrefillBudget:
    """Prompt tokens per iteration: ``max_tokens`` alone, a ``slice_ms`` slice while decoding.

    ``min_tokens`` keeps a slice from shrinking to nothing when the rate is low, so a long
    prompt always makes progress.
    """

    def __init__(
        self,
        max_tokens: int,
        slice_ms: float,
        min_tokens: int = 16,
        rate_min_tokens: int = RATE_MIN_TOKENS,
    ) -> None:
        if max_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1 (got {max_tokens})")
        if slice_ms < 0:
            raise ConfigError(f"prefill_slice_ms must be >= 0 (got {slice_ms})")
        self.max_tokens = max_tokens
        self.slice_ms = slice_ms
        self.min_tokens = min(min_tokens, max_tokens)
        self.rate_min_tokens = min(rate_min_tokens, max_tokens)
        self.rate: float | None = None  # prompt tokens/s of prefill-only forwards, once measured
        self.mixed_rate: float | None = None  # (prompt tokens + decodes)/s of the other forwards

    def tokens(self, decoding: bool) -> int:
        """The budget of this iteration; ``decoding``: some sequences wait for their next token
        (the slice is prefill work on top of their own decode, packed or not)."""
        rate = self.rate if self.rate is not None else self.mixed_rate
        if not decoding or not self.slice_ms or rate is None:
            return self.max_tokens
        by_time = int(rate * self.slice_ms / 1000.0)
        return max(self.min_tokens, min(self.max_tokens, by_time))

    def record(self, tokens: int, seconds: float, decodes: int = 0) -> None:
        """A forward of ``tokens`` prompt tokens and ``decodes`` decode rows took ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        if decodes == 0 and tokens >= self.rate_min_tokens:
            self.rate = _average(self.rate, tokens / seconds)
        else:
            self.mixed_rate = _average(self.mixed_rate, (tokens + decodes) / seconds)
