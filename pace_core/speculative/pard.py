"""PARD proposer: a parallel draft model proposes ``k`` tokens in one forward.

The draft gets the tokens it has not seen yet (accepted drafts and the target's last token)
followed by ``k - 1`` copies of its mask token. The logits at the last real token give draft 1,
those at the masks give drafts 2..k. The mask positions are cropped from the draft's KV cache
right after the forward, so the cache only ever holds real history.

The mask token id comes from, in order: ``PardSpecDecodeConfig.pard_token``, then the draft
config's ``pard_token``, ``mask_token_id``, ``ptd_token_id`` and ``dflash_config.mask_token_id``
(the keys the PARD / vLLM parallel-drafting checkpoints use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.speculative.draft import ModelProposer
from pace_core.speculative.inferencer import ModelInferencer
from pace_core.speculative.proposer import Proposal, RowSampling, choose_drafts

__all__ = ["MASK_TOKEN_KEYS", "PardProposer", "resolve_pard_token"]

MASK_TOKEN_KEYS = ("pard_token", "mask_token_id", "ptd_token_id")


def resolve_pard_token(config: Any, explicit: int | None, embed_rows: int, where: str) -> int:
    """The PARD mask token id (see the module doc); raises ConfigError when there is none."""
    token = explicit
    if token is None:
        for key in MASK_TOKEN_KEYS:
            if getattr(config, key, None) is not None:
                token = getattr(config, key)
                break
    if token is None:
        dflash = getattr(config, "dflash_config", None)
        if isinstance(dflash, dict) and dflash.get("mask_token_id") is not None:
            token = dflash["mask_token_id"]
    if token is None:
        raise ConfigError(
            f"PARD draft {where} has no mask token: its config sets none of "
            f"{', '.join(MASK_TOKEN_KEYS)}, dflash_config.mask_token_id; pass "
            "PardSpecDecodeConfig(..., pard_token=ID) (or use DraftSpecDecodeConfig for a "
            "classic autoregressive draft)"
        )
    if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < embed_rows:
        raise ConfigError(
            f"PARD mask token {token!r} of {where} is not a token id of the draft's "
            f"embedding [0, {embed_rows})"
        )
    return token


class PardProposer(ModelProposer):
    """Parallel drafting with ``mask_token`` (see the module doc)."""

    def __init__(
        self, inferencer: ModelInferencer, mask_token: int, cache: Any | None = None
    ) -> None:
        super().__init__(inferencer, cache)
        self.mask_token = mask_token

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None = None,
    ) -> Proposal:
        suffixes, k, sampling = self._start_round(contexts, k, sampling, 0)
        masks = [max(kb, 1) - 1 for kb in k]
        queries = [s + [self.mask_token] * m for s, m in zip(suffixes, masks)]
        logits = self.inferencer.forward(queries, self.kv, all_logits=True)
        self.kv.crop(masks)
        for row, s in zip(self.held, suffixes):
            row.extend(s)
        self._mark()  # nothing to roll back later: the masks are gone already
        if self.mask_token < logits.shape[-1]:
            logits[..., self.mask_token] = float("-inf")  # never propose the mask itself
        b, width = len(contexts), logits.shape[1]
        rows = torch.arange(b)
        tokens: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        for j in range(max(k, default=0)):
            cols = torch.tensor([width - kb + j if j < kb else width - 1 for kb in k])
            drafted, q = choose_drafts(logits[rows, cols], sampling)
            for i, t in enumerate(drafted.tolist()):
                if j < k[i]:
                    tokens[i].append(t)
                    if q[i] is not None:
                        probs[i].append(q[i])
        return Proposal(tokens, [torch.stack(p) if p else None for p in probs])
