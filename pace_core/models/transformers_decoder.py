"""A causal LM pace has no family for: transformers' own modeling code, compiled with the pace
backend (:mod:`pace_core.compile`: its linears, gated MLPs, norms and embeddings on the plugin
kernels), attending with pace's attention kernel over pace's KV caches.

The attention is transformers' attention interface under the name ``"pace"``: each attention
module hands its new keys and values to the step's cache (``cache.update``) and attends over
the cache's view with the ``attention`` kernel the resolver picked for that layer. So the
model decodes in the engine core like any family (continuous batching over the block caches,
prefix caching, speculative rollback); transformers never holds a cache of its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pace_core.binder import KernelBinder, OpPlan
from pace_core.caches.base import StepMeta
from pace_core.compile import PaceBackend
from pace_core.compile.backend import direct_call
from pace_core.errors import ModelLoadError
from pace_core.models.common import heads
from pace_core.models.layers import StepContext
from pace_core.opconfig import OpResolver

log = logging.getLogger("pace.models")

ATTENTION = "pace"  # the attn_implementation name registered with transformers
_current = threading.local()  # the step being run on this thread (the attention reads it)


def supported_by_transformers(model_type: str | None) -> bool:
    """Whether transformers has a causal LM class for ``model_type``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _attend_now(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int, scale: float
) -> torch.Tensor:
    """Layer ``layer``'s attention of the running step: the new ``key/value [B, Hk, T, D]``
    into the step's cache, ``query [B, Hq, T, D]`` over its view; returns ``[B, T, Hq, D]``."""
    decoder: TransformersDecoder | None = getattr(_current, "decoder", None)
    step: StepContext | None = getattr(_current, "step", None)
    if decoder is None or step is None:
        raise RuntimeError(
            f"attn_implementation={ATTENTION!r} attends over a pace KV cache: call the model "
            "through pace (LLMModel or TransformersDecoder.forward), not directly"
        )
    view = step.views[layer] = step.cache.update(layer, key, value)
    out = decoder.attention[layer](query, view, scale, None, decoder.windows[layer])
    return out.transpose(1, 2)


# The attention as an opaque op of the captured graph (Dynamo traces the model whole, with no
# graph break per layer); the pace backend calls _attend_now directly in its place.
_attention_op = torch.library.custom_op("pace::transformers_attention", mutates_args=())(
    _attend_now
)


@_attention_op.register_fake
def _attention_shape(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int, scale: float
) -> torch.Tensor:
    b, h, t, d = query.shape
    return query.new_empty(b, h, t, d).transpose(1, 2)


direct_call(torch.ops.pace.transformers_attention.default, _attend_now)


def _attend(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface call, as the ``pace`` implementation."""
    layer = int(module.layer_idx)
    scale = float(heads(module.config)[2] ** -0.5 if scaling is None else scaling)
    return torch.ops.pace.transformers_attention(query, key, value, layer, scale), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """transformers' mask for the ``pace`` attention: none (the cache's step metadata masks)."""
    return None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attend)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


class TransformersDecoder:
    """The decoder interface of :class:`~pace_core.models.decoder.DecoderLM` (what the
    engine, the caches and the speculative decoder use) over a transformers model."""

    reprefill_at: int | None = None
    packs_ragged_steps = False
    value_dims: list[int] | None = None

    def __init__(
        self, model: torch.nn.Module, dtype: torch.dtype, resolver: OpResolver, cache_layout: str
    ) -> None:
        self.model = model
        self.config = model.config
        self.dtype = dtype
        self.vocab_size = int(model.config.vocab_size)
        modules = _attention_modules(model)
        self.num_layers = len(modules)
        num_heads, kv_heads, head_dim = heads(model.config)
        self.num_kv_heads = [kv_heads] * len(modules)
        self.head_dims = [head_dim] * len(modules)
        self.windows = [getattr(m, "sliding_window", None) for m in modules]
        self.backend = PaceBackend(resolver=resolver)
        self.plan: OpPlan = self.backend.plan
        binder = KernelBinder(dtype, resolver)
        binder.plan = self.plan
        self.attention = [
            binder.kernel(
                "attention", head_dim=d, gqa=num_heads // kv, window=w, sinks=False,
                cache_layout=cache_layout,
            ).fn
            for d, kv, w in zip(self.head_dims, self.num_kv_heads, self.windows)
        ]  # fmt: skip
        self.compiled = torch.compile(model, backend=self.backend)

    def compile_now(self, new_cache: Callable[[], Any]) -> None:
        """Compile the graphs a generation needs (prompts and decodes of one sequence, then
        of two, where Dynamo turns the shapes dynamic) on throwaway caches from
        ``new_cache``: the op plan is whole after loading and no request waits for a
        compilation."""
        from pace_core.models.decoder import forward_step

        with torch.inference_mode():
            for rows in (1, 2):
                cache = new_cache()
                seqs = cache.add_sequences(rows)
                forward_step(
                    self, cache, seqs, torch.arange(1, 3 * rows + 1).view(rows, 3), [3] * rows
                )
                forward_step(self, cache, seqs, torch.full((rows, 1), 4), [1] * rows)

    def make_step(self, cache: Any, meta: StepMeta) -> StepContext:
        return StepContext(cache, meta.positions(), meta=meta)

    def forward(
        self, ids: torch.Tensor, step: StepContext, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Logits ``[B, V]`` for the last position, or ``[B, T, V]`` with ``all_logits``."""
        _current.decoder, _current.step = self, step
        try:
            out = self.compiled(
                input_ids=ids,
                position_ids=step.positions,
                use_cache=False,
                logits_to_keep=0 if all_logits else 1,
            )
        finally:
            _current.decoder = _current.step = None
        logits = out.logits.float()
        return logits if all_logits else logits[:, -1]


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention module of every layer, in layer order."""
    found = {
        m.layer_idx: m
        for m in model.modules()
        if isinstance(getattr(m, "layer_idx", None), int) and type(m).__name__.endswith("Attention")
    }
    layers = int(model.config.num_hidden_layers)
    if sorted(found) != list(range(layers)):
        raise ModelLoadError(
            f"{type(model).__name__}: found attention modules for layers {sorted(found)} of "
            f"{layers}; pace runs transformers models whose every layer attends"
        )
    return [found[i] for i in range(layers)]


_UNSUPPORTED = {  # config attribute -> what pace's attention kernel does not do
    "attn_logit_softcapping": "attention logit soft-capping",
    "alibi": "ALiBi position biases",
    "use_alibi": "ALiBi position biases",
}


def load(
    path: Path,
    config: Any,
    dtype: torch.dtype,
    resolver: OpResolver,
    cache_layout: str,
    *,
    strict: bool = True,
) -> TransformersDecoder:
    """transformers' model for ``config`` from ``path``, ready to decode through pace: every
    weight the model declares must be in the checkpoint (transformers would initialise a
    missing one at random), and with ``strict`` nothing else may be."""
    from transformers import AutoModelForCausalLM

    for attr, what in _UNSUPPORTED.items():
        if getattr(config, attr, None):
            raise ModelLoadError(
                f"model_type {config.model_type!r} has no pace family and uses {what} "
                f"({attr}={getattr(config, attr)!r}), which pace's attention kernels do not "
                "implement; run it with transformers"
            )
    _register_attention()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=ATTENTION, output_loading_info=True
        )
    except ValueError as exc:  # the architecture does not take an attention interface
        raise ModelLoadError(
            f"model_type {config.model_type!r} has no pace family, and its transformers code "
            f"does not accept a custom attention ({exc}); run it with transformers"
        ) from None
    _check_weights(path, config.model_type, info, strict)
    model.eval().requires_grad_(False)
    return TransformersDecoder(model, dtype, resolver, cache_layout)


def _check_weights(path: Path, model_type: str, info: dict[str, Any], strict: bool) -> None:
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(str(m) for m in info.get("mismatched_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensors: {', '.join(missing[:5])}")
    if mismatched:
        problems.append(
            f"{len(mismatched)} tensors of the wrong shape: {', '.join(mismatched[:3])}"
        )
    if unexpected and strict:
        problems.append(
            f"{len(unexpected)} unexpected tensors: {', '.join(unexpected[:5])} (strict=False "
            "ignores them)"
        )
    if problems:
        raise ModelLoadError(
            f"{path} does not hold a {model_type!r} checkpoint transformers can load whole: "
            + "; ".join(problems)
        )
    if unexpected:
        log.warning("ignored %d unexpected tensors (strict=False)", len(unexpected))


__all__ = ["ATTENTION", "TransformersDecoder", "load", "supported_by_transformers"]
