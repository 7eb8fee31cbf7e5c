"""Incremental detokenization: text deltas that are valid UTF-8 and keep SentencePiece spaces."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Decodes a growing token list a few tokens at a time.

    Each call decodes a short window that starts a few tokens back, so leading-space rules of
    SentencePiece/BPE tokenizers see their context; text ending in an incomplete UTF-8
    sequence (U+FFFD) is held until the next token completes it.
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens before this index have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token: int) -> str:
        """Append one token; return the newly completed text (may be empty)."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Text of tokens still held back (an incomplete character at the very end)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return after[len(before) :] if after.startswith(before) else ""
