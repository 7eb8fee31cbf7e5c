"""The model builder of one rank's shard: the families build it as they build any model
(from the shard's config and the sliced weights); this builder adds what splitting changes.

- the output projection and every MLP (gated MLP, routed experts) end with a sum over the
  ranks: their kernel is bound with an all-reduce after it (an o_proj bias is rank 0's
  only: the others read zeros, :func:`~pace_core.parallel.shard.slice_rule`);
- the LM head keeps the rank's rows of the vocabulary (a tied head: its rows of the
  replicated embedding table); :class:`~pace_core.parallel.model.ShardedDecoderLM` gathers
  the logits;
- ``decoder_stack`` is the per-layer loop (native): a fused stack runs every block in one
  call and takes no all-reduce between attention and MLP. The op plan says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from pace_core.models.builder import Matrix, ModelBuilder
from pace_core.models.layers import Bound, GatedMLP
from pace_core.opconfig import Resolution
from pace_core.parallel.comm import Comm
from pace_core.parallel.shard import vocab_rows
from pace_core.quant import QuantizedWeight

log = logging.getLogger("pace.parallel")

STACK_NOTE = (
    "tensor parallel: an all-reduce follows each attention and MLP, which a fused stack "
    "cannot take between its blocks (per-layer path)"
)


def reduced(fn: Callable[..., torch.Tensor], comm: Comm) -> Callable[..., torch.Tensor]:
    """``fn`` followed by an all-reduce (sum over the ranks) of its output."""
    all_reduce = comm.all_reduce

    def run(*args: Any) -> torch.Tensor:
        return all_reduce(fn(*args).contiguous())

    run.__name__ = f"all_reduced_{getattr(fn, '__name__', 'kernel')}"
    return run


class VocabShard:
    """A head weight prepared for this rank's vocabulary rows; hides ``rows()`` so the
    embedding never looks its (whole-vocabulary) rows up in it."""

    __slots__ = ("weight",)

    def __init__(self, weight: Any) -> None:
        self.weight = weight


def _head(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def head(x: torch.Tensor, shard: VocabShard) -> torch.Tensor:
        return fn(x, shard.weight)

    return head


def _vocab_part(weight: Matrix, rank: int, size: int) -> Matrix:
    first, end, per = vocab_rows(int(weight.shape[0]), rank, size)
    if isinstance(weight, QuantizedWeight):
        part = weight.rows(slice(first, end))
        if end - first == per:
            return part
        pad = weight.rows(slice(0, per - (end - first)))  # zero codes and scales: zero rows
        parts = {"data": pad.data, "scales": pad.scales, "mins": pad.mins}
        zero = {k: None if t is None else torch.zeros_like(t) for k, t in parts.items()}
        return QuantizedWeight.cat([part, replace(pad, **zero)])
    part = weight[first:end]
    if end - first < per:
        part = torch.cat([part, part.new_zeros(per - (end - first), *part.shape[1:])])
    return part.contiguous()


class ShardBuilder(ModelBuilder):
    """:class:`ModelBuilder` of rank ``comm.rank``'s shard (see the module doc)."""

    def __init__(self, *args: Any, comm: Comm, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comm = comm

    def bind(self, op: str, attrs: dict[str, Any], *weights: Any) -> Bound:
        bound = super().bind(op, attrs, *weights)
        if op == "moe":  # each rank holds every expert's share of the intermediate size
            bound.fn = reduced(bound.fn, self.comm)
        return bound

    def linear(
        self,
        name: str,
        *,
        bias: bool = False,
        weight: Matrix | None = None,
        head: bool = False,
        keep_format: bool = False,
    ) -> Bound:
        if head:
            if weight is not None:  # tied: this rank's rows of the embedding table
                weight = _vocab_part(weight, self.comm.rank, self.comm.size)
            bound = super().linear(name, bias=bias, weight=weight, head=True)
            return Bound(_head(bound.fn), VocabShard(bound.weight))
        bound = super().linear(name, bias=bias, weight=weight, keep_format=keep_format)
        if not name.endswith(".o_proj"):  # a router: replicated
            return bound
        return Bound(reduced(bound.fn, self.comm), bound.weight)

    def gated_mlp(
        self, gate: Matrix, up: Matrix, down: Matrix, activation: str, *, module: str = ""
    ) -> GatedMLP:
        mlp = super().gated_mlp(gate, up, down, activation, module=module)
        return GatedMLP(
            reduced(mlp.fn, self.comm), mlp.weight, activation, mlp.hidden, mlp.intermediate
        )

    def stack(self, layers: Sequence[Callable]) -> Bound:
        """The native per-layer ``decoder_stack``, with why in the op plan."""
        native = next(
            k for k in self.resolver.registry.where(op="decoder_stack") if k.backend == "native"
        )
        requested = self.resolver.config.backend_for("decoder_stack")
        res = Resolution("decoder_stack", requested, native, fallback_reason=STACK_NOTE)
        prepared = native.prepare(layers) if native.prepare is not None else layers
        kernel = self._use(res)
        if self.comm.leader:
            log.info("tensor parallel x%d: %s", self.comm.size, STACK_NOTE)
        return Bound(kernel.fn, prepared)
