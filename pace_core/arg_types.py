"""argparse value types shared by the CLIs: a bad value exits 2 with argparse's one line,
before any model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def at_least(
    minimum: float, kind: type = int, maximum: float | None = None
) -> Callable[[str], Any]:
    """A ``kind`` value >= ``minimum`` (and <= ``maximum`` when given; NaN refused)."""
    if maximum is None:
        return _checked(kind, lambda v: v >= minimum, f">= {minimum}")
    return _checked(kind, lambda v: minimum <= v <= maximum, f"in [{minimum}, {maximum}]")


def above(minimum: float, kind: type = float) -> Callable[[str], Any]:
    """A ``kind`` value > ``minimum`` (NaN refused)."""
    return _checked(kind, lambda v: v > minimum, f"> {minimum}")


def _checked(kind: type, ok: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not ok(value):  # a comparison with NaN is false: refused too
            raise argparse.ArgumentTypeError(f"{text!r}: expected a value {expected}")
        return value

    return parse
