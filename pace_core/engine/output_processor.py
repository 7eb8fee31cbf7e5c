"""The output processor: the engine core's token ids -> what callers receive.

The core's step emits each token with the finish reason the tokens decide (EOS,
``max_new_tokens``, the context window) and no text; as the step's events leave the core,
:class:`OutputProcessor` adds per sequence the text delta (incremental detokenization, UTF-8
safe) and applies the stop strings, which end a sequence on its text: it returns the
sequences they ended so the core retires them. A token of such a sequence after the stop (a
speculative run goes on) is dropped, and a speculative step's ``emitted`` count is trimmed to
the tokens delivered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pace_core.engine.detokenize import IncrementalDetokenizer
from pace_core.engine.events import SeqError, SpecStep, Token
from pace_core.errors import ConfigError
from pace_core.models.token_bytes import TokenBytes, unfinished_utf8
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.stop import StopChecker


class _Text:
    """One sequence's text so far: its detokenizer and stop-string checker."""

    __slots__ = ("detok", "stop")

    def __init__(self, tokenizer: Any, config: SamplingConfig, unfinished: list[int]) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, unfinished=unfinished)
        self.stop = StopChecker(config.stop)

    def add(self, token: int, finished: bool) -> tuple[str, bool]:
        """The text ``token`` releases and whether a stop string ended the sequence with it;
        ``finished``: the core ended it with this token (the held-back text is released)."""
        update = self.stop.feed(self.detok.add(token))
        if update.stopped:
            return update.text, True
        if not finished:
            return update.text, False
        return update.text + self.stop.feed(self.detok.flush()).text + self.stop.flush(), False


class OutputProcessor:
    """Text and stop strings of many sequences (see the module doc).

    Without a tokenizer, tokens pass through with empty text (stop strings are refused).
    """

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._bytes = None if tokenizer is None else TokenBytes(tokenizer)
        self._texts: dict[str, _Text | None] = {}

    def start(self, key: str, config: SamplingConfig, prompt: Sequence[int] = ()) -> None:
        """Follow a new sequence of ``prompt``."""
        if self._bytes is None:
            if config.stop:
                raise ConfigError(
                    "stop strings match the text, and this model has no tokenizer: load it "
                    "with one, or end on token ids (eos_token_id=[...])"
                )
            self._texts[key] = None
            return
        self._texts[key] = _Text(self.tokenizer, config, self._unfinished(prompt))

    def _unfinished(self, prompt: Sequence[int]) -> list[int]:
        """The prompt's last tokens that hold bytes of a character it does not finish."""
        assert self._bytes is not None
        tail = [int(t) for t in prompt[-4:]]  # a character has at most 4 bytes
        parts = [self._bytes(t) for t in tail]
        cut, k = unfinished_utf8(b"".join(parts)), 0
        while cut > 0 and k < len(parts):
            k += 1
            cut -= len(parts[-k])
        return tail[len(tail) - k :]

    def forget(self, key: str) -> None:
        """Stop following a sequence (cancelled, failed)."""
        self._texts.pop(key, None)

    def process(self, events: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """One step's events with text on the tokens (other events pass through); returns
        them and the keys a stop string ended (to cancel in the core)."""
        out: list[Any] = []
        stopped: list[str] = []
        steps: dict[str, int] = {}  # key -> index in out of its SpecStep of this batch
        delivered: dict[str, int] = {}
        for ev in events:
            if isinstance(ev, SpecStep):
                if ev.key in self._texts:
                    steps[ev.key] = len(out)
                    delivered[ev.key] = 0
                    out.append(ev)
                continue
            if not isinstance(ev, Token):
                if isinstance(ev, SeqError):  # the sequence ended
                    self._texts.pop(ev.key, None)
                out.append(ev)
                continue
            if ev.key not in self._texts:
                continue  # the sequence ended before the core heard (or was never followed)
            text = self._texts[ev.key]
            finished = ev.finish_reason is not None
            delta, by_stop = ("", False) if text is None else text.add(ev.token, finished)
            if by_stop:
                stopped.append(ev.key)
                ev = dataclasses.replace(ev, text=delta, finish_reason="stop")
            elif delta:
                ev = dataclasses.replace(ev, text=delta)
            if ev.finish_reason is not None:
                del self._texts[ev.key]
            if ev.key in delivered:
                delivered[ev.key] += 1
            out.append(ev)
        for key, at in steps.items():
            if out[at].emitted != delivered[key]:
                out[at] = dataclasses.replace(out[at], emitted=delivered[key])
        return out, stopped
