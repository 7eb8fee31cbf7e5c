"""argparse value types shared by the CLIs: a bad value exits 2 with argparse's one line,
before any model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def at_least(minimum: float, kind: type = int) -> Callable[[str], Any]:
    """A ``kind`` value >= ``minimum`` (NaN refused)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value >= minimum:  # also refuses NaN
            raise argparse.ArgumentTypeError(f"{text!r}: expected a value >= {minimum}")
        return value

    return parse
