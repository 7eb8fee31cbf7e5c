"""Comparison rules shared by the parity tests."""

from __future__ import annotations

import torch


def topk_rule_ok(ref_logits: torch.Tensor, token: int, k: int = 5, tol: float = 0.5) -> bool:
    """A bf16 token is acceptable when it is in the reference's top-k and its reference
    logprob is within ``tol`` nats of the best (a near-tie)."""
    lp = torch.log_softmax(ref_logits.float(), dim=-1)
    top = lp.topk(k)
    return token in top.indices.tolist() and float(top.values[0] - lp[token]) <= tol
