"""How many prompt tokens one scheduler iteration may prefill.

A prefill chunk runs before the iteration's decode step, so every running sequence waits for
it: a 512-token chunk adds hundreds of milliseconds to the time between two of their tokens.
:class:`PrefillBudget` keeps that wait short. With nothing decoding, an iteration prefills up
to ``max_tokens`` (fastest time to first token); while sequences decode, it prefills about
``slice_ms`` of work, converted to tokens at the prefill rate measured so far (an exponential
average of tokens per second over this engine's prefill forwards). ``slice_ms = 0`` turns the
slicing off (always ``max_tokens``).
"""

from __future__ import annotations

from pace_core.errors import ConfigError

_SMOOTHING = 0.3  # weight of the newest measurement in the rate average


class PrefillBudget:
    """Prompt tokens per iteration: ``max_tokens`` alone, a ``slice_ms`` slice while decoding.

    ``min_tokens`` keeps a slice from shrinking to nothing when the rate is low, so a long
    prompt always makes progress.
    """

    def __init__(self, max_tokens: int, slice_ms: float, min_tokens: int = 16) -> None:
        if max_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1 (got {max_tokens})")
        if slice_ms < 0:
            raise ConfigError(f"prefill_slice_ms must be >= 0 (got {slice_ms})")
        self.max_tokens = max_tokens
        self.slice_ms = slice_ms
        self.min_tokens = min(min_tokens, max_tokens)
        self.rate: float | None = None  # prefill tokens per second, once measured

    def tokens(self, decoding: bool) -> int:
        """The budget of this iteration; ``decoding``: some sequences wait for their next token
        (the slice is prefill work on top of their own decode, packed or not)."""
        if not decoding or not self.slice_ms or self.rate is None:
            return self.max_tokens
        by_time = int(self.rate * self.slice_ms / 1000.0)
        return max(self.min_tokens, min(self.max_tokens, by_time))

    def record(self, tokens: int, seconds: float) -> None:
        """A forward of ``tokens`` tokens (prompt chunks, and the decodes packed with them)
        took ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        self.rate = rate if self.rate is None else (1 - _SMOOTHING) * self.rate + _SMOOTHING * rate
