"""Top-k routed mixture-of-experts MLPs (GPT-OSS, Qwen3-MoE): a router feeding op ``moe``.

Two routings, as the families define them:

* ``topk_softmax`` (GPT-OSS): the top-k router logits, softmax over those k;
* ``softmax_topk`` (Qwen3-MoE): softmax over every expert in fp32, the top-k probabilities,
  renormalised to sum 1 when ``normalize`` (``norm_topk_prob``).

Both choose the same experts (softmax is monotonic); they differ in the weights when
``normalize`` is off.
"""

from __future__ import annotations

import torch

from pace_core.models.layers import Bound
from pace_core.stack_spec import MoESpec

__all__ = ["ROUTINGS", "MoE"]

ROUTINGS = ("topk_softmax", "softmax_topk")


class MoE:
    """Router (a bound linear) + experts (a bound ``moe`` kernel)."""

    __slots__ = ("experts", "normalize", "router", "routing", "top_k")

    def __init__(
        self,
        router: Bound,
        experts: Bound,
        top_k: int,
        routing: str = "topk_softmax",
        normalize: bool = True,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"unknown MoE routing {routing!r}; known: {', '.join(ROUTINGS)}")
        self.router, self.experts, self.top_k = router, experts, top_k
        self.routing, self.normalize = routing, normalize

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen experts [N, k] int64, their weights [N, k]) of tokens ``flat`` [N, H]."""
        logits = self.router(flat)
        if self.routing == "topk_softmax":
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            return chosen, torch.softmax(top, dim=-1)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return chosen, top.to(logits.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights = self.route(flat)
        return self.experts.fn(flat, chosen, weights, self.experts.weight).view(shape)

    def describe(self) -> MoESpec:
        return MoESpec(self.router, self.experts, self.top_k, self.routing, self.normalize)
