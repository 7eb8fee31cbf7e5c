"""The raw bytes a token stands for, from its tokenizer's decoder: byte-level BPE (GPT-2's
alphabet), SentencePiece byte fallback (``<0xE7>``), or else its decoded text's UTF-8.

A token that holds part of a multi-byte character decodes alone to U+FFFD; its bytes are what
logprobs report (OpenAI: the ``bytes`` of consecutive tokens concatenate to the text).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def unfinished_utf8(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a character they do not finish."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # not a continuation byte: ASCII or a lead byte
            need = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return back if back < need else 0
    return 0


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: character -> the byte it stands for (printable bytes
    stand for themselves, the other 68 for the characters from U+0100 on, in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = 0x100 + n
    return {chr(c): b for b, c in chars.items()}


def _decoder_types(tokenizer: Any) -> set[str]:
    """The types of the fast tokenizer's decoder and of the decoders it chains."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(decoder.__getstate__()))
    return found


class TokenBytes:
    """Token id -> its bytes for one tokenizer (see the module doc)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        types = _decoder_types(tokenizer)
        self.byte_level = "ByteLevel" in types
        self.byte_fallback = "ByteFallback" in types

    def __call__(self, token: int, text: str | None = None) -> bytes:
        """The bytes of ``token``; ``text`` is its decoded text when the caller has it."""
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        raw = convert(token) if convert is not None else None
        if isinstance(raw, str) and raw:
            if self.byte_fallback and (m := _BYTE_FALLBACK.fullmatch(raw)):
                return bytes([int(m.group(1), 16)])
            alphabet = byte_level_alphabet()
            if self.byte_level and all(c in alphabet for c in raw):
                return bytes(alphabet[c] for c in raw)
        if text is None:
            text = self.tokenizer.decode([token])
        return text.encode("utf-8")
