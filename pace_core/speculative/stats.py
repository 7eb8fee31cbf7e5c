"""Speculative decoding counters: per sequence, per batch and since the model was loaded.

Definitions (one *step* = one target verification forward for one sequence):

* ``num_steps``: verification steps (including steps where the proposer had nothing to offer).
* ``num_drafts``: steps with at least one proposed token.
* ``num_draft_tokens`` / ``num_accepted_tokens``: proposed / accepted draft tokens.
* ``accepted_per_position[j]`` / ``proposed_per_position[j]``: how often draft position ``j``
  (0 = first drafted token) was proposed / accepted; their ratio is the per-position rate.
* ``num_emitted_tokens``: tokens delivered by verification steps (accepted drafts plus the
  target's correction or bonus token, after trimming at EOS / stop strings / max_new_tokens).

Everything is a plain counter, so a server can export them as Prometheus counters as they are
(:meth:`SpecStats.to_dict`); rates are derived properties.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SpecStats"]


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


@dataclass
class SpecStats:
    """Counters of one sequence, one batch, or a model's lifetime (see the module doc).

    ``draft_seconds`` / ``verify_seconds`` are wall times of proposing and verifying; they are
    batch totals (0 in per-sequence stats, where a forward is shared by all rows).
    """

    num_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def record(self, proposed: int, accepted: int, emitted: int) -> None:
        """Account one verification step of one sequence."""
        self.num_steps += 1
        self.num_emitted_tokens += emitted
        if proposed == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        self.proposed_per_position = _add_lists(self.proposed_per_position, [1] * proposed)
        self.accepted_per_position = _add_lists(self.accepted_per_position, [1] * accepted)

    def merge(self, other: SpecStats) -> SpecStats:
        """Add ``other``'s counters into this object (returns ``self``)."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, _add_lists(a, b) if isinstance(a, list) else a + b)
        return self

    @classmethod
    def total(cls, items: Iterable[SpecStats]) -> SpecStats:
        """The sum of several stats objects."""
        out = cls()
        for item in items:
            out.merge(item)
        return out

    # -- derived -------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0 when nothing was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """For each draft position, accepted / proposed."""
        acc = self.accepted_per_position
        return [
            (acc[i] if i < len(acc) else 0) / p if p else 0.0
            for i, p in enumerate(self.proposed_per_position)
        ]

    @property
    def mean_accepted_length(self) -> float:
        """Mean number of accepted draft tokens per step that had a draft."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens delivered per target verification forward (1.0 = no gain)."""
        return self.num_emitted_tokens / self.num_steps if self.num_steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Counters and derived rates as plain JSON-able values."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["proposed_per_position"] = list(self.proposed_per_position)
        out["accepted_per_position"] = list(self.accepted_per_position)
        out["acceptance_rate"] = self.acceptance_rate
        out["acceptance_rate_per_position"] = self.acceptance_rate_per_position
        out["mean_accepted_length"] = self.mean_accepted_length
        out["tokens_per_step"] = self.tokens_per_step
        return out
