"""Top-k routed mixture-of-experts MLPs: a router, a :class:`Routing` rule, op ``moe`` and an
optional shared expert.

The routings, as the families define them (``logits`` = the router's output per token):

* ``topk_softmax`` (GPT-OSS): the top-k logits, softmax over those k;
* ``softmax_topk`` (Qwen3-MoE): softmax over every expert in fp32, the top-k probabilities;
* ``topk_sigmoid`` (Llama 4): the top-k logits, sigmoid of each;
* ``grouped_sigmoid`` (DeepSeek-V3): sigmoid of fp32 logits; the choice adds a per-expert
  ``choice_bias`` and keeps the ``top_groups`` best of ``groups`` contiguous expert groups
  (a group's score = the sum of its two best), the weights are the unbiased sigmoids.

Then weights are renormalised to sum 1 when ``normalize``, multiplied by ``scale`` and by
each chosen expert's ``expert_scales`` entry (Gemma 4).
``scale_input`` (Llama 4) weighs each expert's input instead of its output.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from pace_core.models.builder import ModelBuilder
from pace_core.models.layers import Bound
from pace_core.quant import formats_of
from pace_core.stack_spec import MoESpec, Routing

__all__ = ["ROUTINGS", "MoE", "Routing", "bind_experts", "expert_tensors", "layer_of", "route"]

ROUTINGS = ("topk_softmax", "softmax_topk", "topk_sigmoid", "grouped_sigmoid")


def _grouped_choice(scores: torch.Tensor, r: Routing) -> torch.Tensor:
    """Experts ``[N, k]`` chosen by DeepSeek-V3's group-limited rule over biased ``scores``."""
    n, e = scores.shape
    grouped = scores.view(n, r.groups, e // r.groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(r.top_groups, dim=-1, sorted=False).indices, True)
    masked = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, e)
    return masked.topk(r.top_k, dim=-1, sorted=False).indices


def route(logits: torch.Tensor, r: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen experts ``[N, k]`` int64, their weights ``[N, k]``) from router ``logits``."""
    if r.kind == "topk_softmax":
        top, chosen = torch.topk(logits, r.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    elif r.kind == "softmax_topk":
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, r.top_k, dim=-1)
    elif r.kind == "topk_sigmoid":
        top, chosen = torch.topk(logits, r.top_k, dim=-1)
        weights = torch.sigmoid(top.float())
    else:  # grouped_sigmoid
        scores = torch.sigmoid(logits.float())
        biased = scores if r.choice_bias is None else scores + r.choice_bias
        chosen = _grouped_choice(biased, r)
        weights = scores.gather(1, chosen)
    if r.normalize:  # the 1e-20 guards DeepSeek's all-zero sigmoids; a no-op on other sums
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if r.scale != 1.0:
        weights = weights * r.scale
    if r.expert_scales is not None:
        weights = weights * r.expert_scales[chosen]
    return chosen, weights if r.fp32_weights else weights.to(logits.dtype)


def bind_experts(
    b: ModelBuilder,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    module: str,
    top_k: int,
    activation: str = "silu",
    biases: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    alpha: float = 1.0,
    limit: float = 0.0,
) -> Bound:
    """Op ``moe`` bound to experts ``gate_up [E, H, 2I]`` (gate/up interleaved) and ``down
    [E, I, H]``; ``alpha``/``limit`` are GPT-OSS's clamped SwiGLU's. Under quantize-on-load
    (unless ``module`` is skipped) each expert's ``[2I, H]`` and ``[H, I]`` matrices are
    quantized one at a time and the op takes the per-expert lists."""
    weights: tuple[Any, Any] = (gate_up, down)
    hidden, intermediate = int(gate_up.shape[1]), int(gate_up.shape[2]) // 2
    q = b.quantization
    if q is not None and not q.skips(module):
        weights = (
            [b.matrix(gate_up[e].t().contiguous(), f"{module}.{e}.gate_up_proj")
             for e in range(gate_up.shape[0])],
            [b.matrix(down[e].t().contiguous(), f"{module}.{e}.down_proj")
             for e in range(down.shape[0])],
        )  # fmt: skip
        del gate_up, down
    attrs = {
        "experts": len(weights[0]),
        "top_k": top_k,
        "activation": activation,
        "biases": any(bias is not None for bias in biases),
        "hidden": hidden,
        "intermediate": intermediate,
        "weight_format": formats_of(weights[0] if isinstance(weights[0], list) else [weights[0]]),
    }
    return b.bind("moe", attrs, weights[0], biases[0], weights[1], biases[1], alpha, limit,
                  activation)  # fmt: skip


def layer_of(prefix: str) -> int:
    """The layer index in a module prefix such as ``model.layers.3.mlp``."""
    return int(re.search(r"layers\.(\d+)\.", prefix + ".").group(1))


def expert_tensors(
    b: ModelBuilder, prefix: str, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, H, 2I] interleaved, down [E, I, H]) in op ``moe``'s layout, from the fused
    tensors of transformers 5 or per-expert ones (``{prefix}.{e}.{gate,up,down}_proj``)."""
    if b.weights.has(f"{prefix}.gate_up_proj"):  # fused: [E, 2I, H] (gate | up), [E, H, I]
        gate, up = b.tensor(f"{prefix}.gate_up_proj").chunk(2, dim=1)
        down = b.tensor(f"{prefix}.down_proj")
    else:
        e = range(num_experts)
        gate = torch.stack([b.tensor(f"{prefix}.{i}.gate_proj.weight") for i in e])
        up = torch.stack([b.tensor(f"{prefix}.{i}.up_proj.weight") for i in e])
        down = torch.stack([b.tensor(f"{prefix}.{i}.down_proj.weight") for i in e])
    gate_up = torch.stack((gate.transpose(1, 2), up.transpose(1, 2)), dim=-1).flatten(-2)
    return gate_up, down.transpose(1, 2)


def check_routing(r: Routing, experts: int) -> None:
    """A clear error for a routing the expert count cannot satisfy."""
    if r.kind not in ROUTINGS:
        raise ValueError(f"unknown MoE routing {r.kind!r}; known: {', '.join(ROUTINGS)}")
    if not 1 <= r.top_k <= experts:
        raise ValueError(f"top_k {r.top_k} must be between 1 and the {experts} experts")
    if r.kind == "grouped_sigmoid":
        if experts % r.groups or experts // r.groups < 2:
            raise ValueError(
                f"{experts} experts cannot form {r.groups} groups of at least 2 (n_group)"
            )
        if not 1 <= r.top_groups <= r.groups:
            raise ValueError(f"topk_group {r.top_groups} must be between 1 and {r.groups}")


class MoE:
    """Router (a bound linear) + experts (a bound ``moe`` kernel) + optional shared expert."""

    __slots__ = ("experts", "router", "routing", "scale_input", "shared")

    def __init__(
        self,
        router: Bound,
        experts: Bound,
        routing: Routing,
        *,
        num_experts: int,
        shared: Callable[[torch.Tensor], torch.Tensor] | None = None,
        scale_input: bool = False,
    ) -> None:
        check_routing(routing, num_experts)
        self.router, self.experts, self.routing = router, experts, routing
        self.shared, self.scale_input = shared, scale_input

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen experts [N, k] int64, their weights [N, k]) of tokens ``flat`` [N, H]."""
        return route(self.router(flat), self.routing)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights = self.route(flat)
        w = self.experts.weight
        if self.scale_input:  # one row per (token, slot), its input weighed, unit output weight:
            # the op is called with k = 1 over N * k rows (its resolved top_k is the model's)
            n, k = chosen.shape
            rows = (flat[:, None, :] * weights[..., None].to(flat.dtype)).reshape(n * k, -1)
            ones = torch.ones(n * k, 1, dtype=flat.dtype)
            out = self.experts.fn(rows, chosen.reshape(-1, 1), ones, w).view(n, k, -1).sum(1)
        else:
            out = self.experts.fn(flat, chosen, weights, w)
        if self.shared is not None:
            out = self.shared(flat) + out
        return out.view(shape)

    def describe(self) -> MoESpec:
        return MoESpec(self.router, self.experts, self.routing, self.shared, self.scale_input)


def fp32_router(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Router logits in fp32 from an fp32 weight, whatever the model dtype (DeepSeek-V3's
    router, whose group-limited choice is sensitive to rounding)."""
    return torch.nn.functional.linear(x.float(), weight)
