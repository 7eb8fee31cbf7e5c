"""Synthetic click data with a known generator, and the metrics DLRM is judged by.

Features: dense values ``log(1 + count)`` of log-normal counts (as Criteo's dense features are
preprocessed), sparse ids drawn from a power law over each table's rows (a few rows are hot,
as in Criteo) and scattered by a fixed bijection of the row range. Labels: a Bernoulli draw
from a *teacher* DLRM's click probability (:class:`~pace_core.dlrm.reference.ReferenceDLRM`
over fp32 weights): the teacher is the Bayes-optimal predictor, so AUC and log loss of a model
with the teacher's weights measure exactly what quantization costs. Every draw comes from a
``torch.Generator`` seeded by the caller: the same seed gives the same data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pace_core.dlrm.config import DLRMConfig

POWER = 4.0  # id = floor(rows * u^POWER): ~60% of draws land in the first 1% of rows
SCATTER = 2654435761  # a prime: (id * SCATTER + table) % rows is a bijection of the rows


@dataclass(frozen=True)
class ClickBatch:
    """``dense [B, F]`` fp32, ``sparse``: one ``[B, L_i]`` int64 per table, and (with a
    teacher) ``labels [B]`` (0./1.) and the teacher's ``probs [B]``."""

    dense: torch.Tensor
    sparse: list[torch.Tensor]
    labels: torch.Tensor | None = None
    probs: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.dense.shape[0])


class SyntheticClicks:
    """Batches of DLRM inputs for ``config``; labelled when a teacher state dict is given."""

    def __init__(
        self,
        config: DLRMConfig,
        teacher: Mapping[str, torch.Tensor] | None = None,
        *,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.seed = seed
        self._teacher = None
        if teacher is not None:
            from pace_core.dlrm.reference import ReferenceDLRM

            self._teacher = ReferenceDLRM(config, teacher).eval()
        gen = torch.Generator().manual_seed(seed)
        # per dense feature: the log-normal's location and spread (fixed by the seed)
        self._mu = torch.rand(config.dense_features, generator=gen) * 3.0
        self._sigma = 0.5 + torch.rand(config.dense_features, generator=gen) * 1.5

    def features(
        self, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``n`` rows of dense and sparse features."""
        cfg = self.config
        counts = torch.exp(torch.randn(n, cfg.dense_features, generator=generator) * self._sigma
                           + self._mu).floor()  # fmt: skip
        dense = torch.log1p(counts)
        sparse = []
        for t, (rows, hot) in enumerate(zip(cfg.table_rows, cfg.multi_hot, strict=True)):
            u = torch.rand(n, hot, generator=generator, dtype=torch.float64)
            ids = (u.pow(POWER) * rows).long().clamp_(max=rows - 1)
            sparse.append((ids * SCATTER + t) % rows)
        return dense, sparse

    def batch(self, n: int, generator: torch.Generator | None = None) -> ClickBatch:
        """``n`` samples (labelled when there is a teacher); ``generator`` defaults to one
        seeded with this generator's seed."""
        gen = generator if generator is not None else torch.Generator().manual_seed(self.seed)
        dense, sparse = self.features(n, gen)
        if self._teacher is None:
            return ClickBatch(dense, sparse)
        from pace_core.dlrm.features import fixed_hotness

        with torch.no_grad():
            indices, offsets = fixed_hotness(sparse)
            probs = torch.sigmoid(self._teacher(dense, indices, offsets))
        labels = torch.bernoulli(probs, generator=gen)
        return ClickBatch(dense, sparse, labels, probs)


def logloss(probs: torch.Tensor, labels: torch.Tensor, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy (natural log) of click probabilities against 0/1 labels."""
    p = probs.double().clamp(eps, 1 - eps)
    y = labels.double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) statistic; tied scores share their mean rank."""
    s, y = scores.double().reshape(-1), labels.reshape(-1) > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = torch.argsort(s)
    sorted_s = s[order]
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True,
                                                  return_counts=True)  # fmt: skip
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2  # ranks first..last of each tie group
    ranks[order] = mean_rank[inverse]
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))
