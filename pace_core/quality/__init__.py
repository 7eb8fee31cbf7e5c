"""How far a model's next-token distributions move from a reference's on a fixed English text:
mean KL divergence, top-1 agreement and perplexity, the way ``llama-perplexity
--kl-divergence`` reports them.

The text (:data:`TEXT`) is public domain: the Declaration of Independence (1776) and Abraham
Lincoln's Gettysburg Address (1863) and Second Inaugural Address (1865), transcribed from the
US National Archives / Library of Congress copies. It is cut into windows of ``window`` tokens;
each window is scored independently (every position after its first), so both models see the
same contexts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

TEXT = Path(__file__).with_name("founding_texts.txt")
SOURCE = (
    "Declaration of Independence (1776), Gettysburg Address (1863), Second Inaugural Address "
    "(1865); US public domain"
)

Scorer = Callable[[torch.Tensor], torch.Tensor]
"""``ids [1, T] -> logits [1, T, V]`` (or ``[T, V]``) of one engine."""


@dataclass(frozen=True)
class QualityReport:
    """Test-vs-reference statistics over ``tokens`` scored positions."""

    tokens: int
    kld_mean: float
    kld_p99: float
    kld_max: float
    top1: float  # share of positions where both engines' most likely token agree
    ppl_reference: float
    ppl: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def text_ids(tokenizer: Any, text: str | None = None) -> torch.Tensor:
    """The token ids ``[N]`` of ``text`` (default: :data:`TEXT`) without special tokens."""
    body = TEXT.read_text() if text is None else text
    return torch.tensor(tokenizer(body, add_special_tokens=False)["input_ids"])


def windows(ids: torch.Tensor, window: int, bos: int | None = None) -> list[torch.Tensor]:
    """``ids`` cut into whole windows of ``window`` tokens (``bos`` prepended to each)."""
    size = window - (bos is not None)
    out = []
    for start in range(0, ids.numel() - size + 1, size):
        chunk = ids[start : start + size]
        if bos is not None:
            chunk = torch.cat([torch.tensor([bos]), chunk])
        out.append(chunk.view(1, -1))
    return out


def _logprobs(scorer: Scorer, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        logits = scorer(ids)
    return torch.log_softmax(logits.reshape(ids.shape[1], -1).float(), dim=-1)[:-1]


def compare(
    reference: Scorer, test: Scorer, chunks: list[torch.Tensor], *, vocab: int | None = None
) -> QualityReport:
    """Score every chunk with both engines and compare position by position.

    ``vocab`` trims both to the first ``vocab`` logits (engines that pad the vocabulary).
    """
    klds, agree, nll_ref, nll = [], 0, 0.0, 0.0
    for ids in chunks:
        ref, got = _logprobs(reference, ids), _logprobs(test, ids)
        if vocab is not None:
            ref, got = ref[:, :vocab], got[:, :vocab]
        targets = ids[0, 1:]
        klds.append((ref.exp() * (ref - got)).sum(-1))
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        nll_ref -= float(ref.gather(1, targets.view(-1, 1)).sum())
        nll -= float(got.gather(1, targets.view(-1, 1)).sum())
    kld = torch.cat(klds).clamp(min=0)
    n = kld.numel()
    return QualityReport(
        tokens=n,
        kld_mean=float(kld.mean()),
        kld_p99=float(kld.quantile(0.99)),
        kld_max=float(kld.max()),
        top1=agree / n,
        ppl_reference=float(torch.exp(torch.tensor(nll_ref / n))),
        ppl=float(torch.exp(torch.tensor(nll / n))),
    )
