"""Structured outputs: a request's ``json_schema`` / ``grammar`` as a per-row token mask.

The grammar engine is `llguidance <https://github.com/guidance-ai/llguidance>`_ (PyPI wheel,
no dependencies). Chosen over xgrammar (needs triton on CPU installs) and outlines-core
(precompiles a regex index per schema, seconds for nested schemas): llguidance builds the
token mask lazily from an Earley parser over the tokenizer's token trie, ~30 us per row per
step on the 49k-token SmolLM2 vocabulary, with no per-schema compile step worth caching.

* :class:`GrammarCompiler` turns one tokenizer into llguidance's token table once (~0.5 s
  for 49k tokens, done on first use) and builds one :class:`RowGrammar` per constrained row;
  :meth:`GrammarCompiler.check` is the up-front validation (a bad schema is a ``ValueError``
  naming llguidance's complaint, before any work is queued).
* :class:`RowGrammar` holds a row's matcher state: ``mask_into`` writes the row's allowed
  tokens into an int32 bitmask, ``accept`` advances it by the sampled token.
* :func:`apply_bitmask` sets disallowed logits to ``-inf`` (vectorised bit unpacking; no
  ``torch.compile``).

Object schemas that list properties are closed unless they say otherwise
(:mod:`pace_core.sampling.schema`). JSON is generated compact (``whitespace_flexible:
false``: ``,`` / ``:`` separators, no free whitespace), so a small model sampling at
temperature 1 cannot wander into whitespace until its token budget runs out. A schema may
override this with its own ``x-guidance`` key.
When the grammar is complete only EOS is allowed, so the row ends by the normal EOS path.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from pace_core.errors import ConfigError
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.schema import closed_objects

__all__ = [
    "GrammarCompiler",
    "RowGrammar",
    "apply_bitmask",
    "bitmask_words",
    "check_constrained",
    "grammar_text",
]

_JSON_DEFAULTS = {"whitespace_flexible": False}
_BITS = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8)


def bitmask_words(vocab_size: int) -> int:
    """int32 words per row of a token bitmask over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def grammar_text(cfg: SamplingConfig) -> str | None:
    """llguidance's grammar document for ``cfg`` (None when the row is unconstrained)."""
    import llguidance

    if cfg.json_schema is not None:
        schema = cfg.json_schema
        if isinstance(schema, str):
            schema = json.loads(schema)  # SamplingConfig checked it parses
        return llguidance.LLMatcher.grammar_from_json_schema(
            closed_objects(schema), defaults=_JSON_DEFAULTS
        )
    if cfg.grammar is not None:
        return llguidance.LLMatcher.grammar_from_lark(cfg.grammar)
    return None


class RowGrammar:
    """One row's grammar state (an llguidance matcher)."""

    def __init__(self, matcher: Any, eos_id: int) -> None:
        self._matcher = matcher
        self._eos = eos_id
        self.failure: str | None = None  # why the grammar engine gave up on the row, if it did

    def mask_into(self, bitmask: Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32, contiguous, CPU).

        A matcher that can go nowhere allows EOS only, so the row ends: a forced token (a
        plugin's logits processor) or the engine's own limits (a schema whose parser state
        outgrows them), which :attr:`failure` then names, so the row ends as an error, never
        as a normal stop."""
        line = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(line.data_ptr(), line.numel() * 4)
        if self._matcher.is_error() or not bool(line.any()):
            if self._matcher.is_error() and self.failure is None:
                self.failure = (
                    "the structured-output grammar engine gave up on this request's schema "
                    f"({self._matcher.get_error()}); simplify the schema"
                )
            line.zero_()
            line[self._eos // 32] = _bit(self._eos % 32)

    def accept(self, token: int) -> None:
        """Advance by the sampled ``token`` (EOS included)."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)


def _bit(b: int) -> int:
    """Bit ``b`` of an int32 word as a Python int in int32 range."""
    return -(1 << 31) if b == 31 else 1 << b


class GrammarCompiler:
    """Builds :class:`RowGrammar` objects for one tokenizer and logits width.

    The tokenizer is converted lazily, under a lock, from a private copy taken here: a Rust
    tokenizer used by another thread at the same time can fail with "Already borrowed", so
    the compiler may be shared by threads (a server's front door and engine) once built.

    Args:
        tokenizer: a Hugging Face fast tokenizer.
        vocab_size: the model's logits width (may exceed the tokenizer's vocabulary).
        eos_token_ids: the model's EOS ids; allowed once the grammar is complete.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        if not eos_token_ids:
            raise ConfigError("structured outputs need the model's EOS token id(s)")
        try:
            self.tokenizer = copy.deepcopy(tokenizer)
        except Exception:  # an exotic tokenizer that cannot be copied: convert the original
            self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self._ll: Any = None
        self._lock = threading.Lock()  # one conversion, even when two threads ask at once

    def warm(self) -> None:
        """Convert the tokenizer now (servers do it in the background at start-up); a
        tokenizer that cannot be converted is reported when a request needs it."""
        with contextlib.suppress(ConfigError):
            self._ll_tokenizer()

    def _ll_tokenizer(self) -> Any:
        with self._lock:
            return self._convert()

    def _convert(self) -> Any:
        if self._ll is None:
            import llguidance.hf

            try:
                self._ll = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
            except Exception as exc:  # slow (python) tokenizers, odd vocabularies
                raise ConfigError(
                    f"structured outputs need a Hugging Face fast tokenizer; "
                    f"{type(self.tokenizer).__name__} could not be converted: {exc}"
                ) from None
        return self._ll

    def check(self, cfg: SamplingConfig) -> None:
        """Raise ``ValueError`` with llguidance's message when ``cfg``'s grammar is invalid."""
        import llguidance

        text = grammar_text(cfg)
        if text is None:
            return
        error = llguidance.LLMatcher.validate_grammar(text, self._ll_tokenizer())
        if error:
            raise ConfigError(f"{_field(cfg)} is not a valid grammar: {error}")

    def row(self, cfg: SamplingConfig) -> RowGrammar | None:
        """A fresh matcher for ``cfg``; None when it is unconstrained."""
        import llguidance

        text = grammar_text(cfg)
        if text is None:
            return None
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), text)
        if matcher.is_error():
            raise ConfigError(f"{_field(cfg)} is not a valid grammar: {matcher.get_error()}")
        return RowGrammar(matcher, self.eos_token_ids[0])


def _field(cfg: SamplingConfig) -> str:
    return "json_schema" if cfg.json_schema is not None else "grammar"


def apply_bitmask(logits: Tensor, bitmask: Tensor) -> None:
    """``logits[r, t] = -inf`` where bit ``t`` of ``bitmask[r]`` is 0 (in place; float [R, V]).

    Bit ``t`` lives in word ``t // 32`` at bit ``t % 32``; on a little-endian CPU the words'
    bytes unpack in token order."""
    rows, vocab = logits.shape
    octets = bitmask.view(torch.uint8)[:, : (vocab + 7) // 8]
    allowed = (octets.unsqueeze(-1) & _BITS).ne(0).reshape(rows, -1)[:, :vocab]
    logits.masked_fill_(~allowed, float("-inf"))


def check_constrained(configs: Sequence[SamplingConfig], compiler: GrammarCompiler | None) -> None:
    """Raise ``ValueError`` when a row asks for a grammar but no compiler is available."""
    if compiler is None and any(c.constrained for c in configs):
        raise ConfigError(
            "json_schema / grammar need a tokenizer: load the model with its tokenizer"
        )
