"""Incremental detokenization: text deltas that are valid UTF-8 and keep SentencePiece spaces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IncrementalDetokenizer:
    """Decodes a growing token list a few tokens at a time.

    Each call decodes a short window that starts a few tokens back, so leading-space rules of
    SentencePiece/BPE tokenizers see their context; text ending in an incomplete UTF-8
    sequence (U+FFFD) is held until the next token completes it.
    """

    def __init__(
        self, tokenizer: Any, *, skip_special_tokens: bool = True, unfinished: Sequence[int] = ()
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # a prompt ending inside a character (token ids cut mid-character): its last tokens,
        # whose bytes the generated ones finish, so the character is the text's first
        self.ids: list[int] = list(unfinished)
        self._prefix = 0  # start of the decode window
        self._read = len(self.ids)  # tokens before this index have been emitted as text
        # characters at the end of the emitted window that stand for unfinished bytes
        shown = self._decode(self.ids) if self.ids else ""
        self._held = len(shown) - len(shown.rstrip("\ufffd"))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emitted(self) -> int:
        """Characters of the window's text already emitted."""
        return len(self._decode(self.ids[self._prefix : self._read])) - self._held

    def add(self, token: int) -> str:
        """Append one token; return the newly completed text (may be empty)."""
        self.ids.append(token)
        start = self._emitted()
        after = self._decode(self.ids[self._prefix :])
        if len(after) > start and not after.endswith("\ufffd"):
            self._prefix, self._read, self._held = self._read, len(self.ids), 0
            return after[start:]
        return ""

    def flush(self) -> str:
        """Text of tokens still held back (an incomplete character at the very end)."""
        start = self._emitted()
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix, self._read, self._held = len(self.ids), len(self.ids), 0
        return after[start:] if after.startswith(before[:start]) else ""
