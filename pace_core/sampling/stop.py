"""Stop conditions on text (stop strings, streamed safely) and on tokens (EOS).

Stop strings are matched on the detokenized text, so one may span token boundaries. A
streaming :class:`StopChecker` releases text as soon as it cannot be part of a stop string and
holds back the trailing characters that might still become one. Among stop strings the one
that completes first wins (earliest start if several complete in the same chunk); the text
from its start on is dropped (kept with ``include_stop_str_in_output=True``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["StopChecker", "StopUpdate", "find_stop", "holdback_length", "is_eos"]


def is_eos(token: int, eos_ids: Collection[int] | int | None, ignore_eos: bool = False) -> bool:
    """True when ``token`` ends the sequence: it is an EOS id and EOS is not ignored."""
    if ignore_eos or eos_ids is None:
        return False
    if isinstance(eos_ids, int):
        return token == eos_ids
    return token in eos_ids


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest ``(position, stop_string)`` in ``text[start:]`` (ties: the longest), or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        pos = text.find(s, start)
        if pos < 0:
            continue
        if best is None or pos < best[0] or (pos == best[0] and len(s) > len(best[1])):
            best = (pos, s)
    return best


def holdback_length(text: str, stops: Sequence[str]) -> int:
    """Chars at the end of ``text`` to withhold from a stream: the longest suffix of ``text``
    that is a proper prefix of some stop string (0 if none)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


@dataclass(frozen=True)
class StopUpdate:
    """Result of :meth:`StopChecker.feed`.

    Attributes:
        text: newly releasable text (trimmed at the stop string when ``stopped``).
        stopped: a stop string occurred; the sequence is finished.
        stop_string: which stop string, when ``stopped``.
    """

    text: str
    stopped: bool = False
    stop_string: str | None = None


class StopChecker:
    """Incremental stop-string detection for one sequence.

    Feed each newly decoded text piece; emit ``update.text``. At the end of generation
    without a stop (EOS / length), call :meth:`flush` to release the held-back tail.
    """

    def __init__(self, stop: Sequence[str] | None = None, include_stop_str_in_output: bool = False):
        self.stop: tuple[str, ...] = tuple(s for s in (stop or ()) if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.output = ""  # all text released so far
        self._pending = ""  # held-back tail: could be the start of a stop string
        self.stopped = False
        self.stop_string: str | None = None

    @property
    def held_back(self) -> int:
        """Number of characters currently withheld."""
        return len(self._pending)

    @property
    def text(self) -> str:
        """Released text plus the held-back tail (everything before any stop string)."""
        return self.output + self._pending

    def feed(self, new_text: str) -> StopUpdate:
        """Add decoded text; returns what may be emitted now and whether a stop occurred."""
        if self.stopped:
            return StopUpdate("", True, self.stop_string)
        if not self.stop:
            self.output += new_text
            return StopUpdate(new_text)
        buf = self._pending + new_text
        hit = find_stop(buf, self.stop)
        if hit is not None:
            pos, s = hit
            out = buf[: pos + len(s)] if self.include_stop_str_in_output else buf[:pos]
            self._pending = ""
            self.output += out
            self.stopped, self.stop_string = True, s
            return StopUpdate(out, True, s)
        hold = holdback_length(buf, self.stop)
        out = buf[: len(buf) - hold]
        self._pending = buf[len(buf) - hold :]
        self.output += out
        return StopUpdate(out)

    def flush(self) -> str:
        """Release the held-back tail (call when the sequence ends for another reason)."""
        out, self._pending = self._pending, ""
        self.output += out
        return out
