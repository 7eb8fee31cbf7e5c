"""The model builder: reads weights by name, resolves each op once and binds the kernels
into blocks (load time only; the forward pass is :mod:`pace_core.models.decoder`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pace_core.binder import KernelBinder
from pace_core.caches.base import Window
from pace_core.errors import ModelLoadError
from pace_core.models.layers import Attention, Bound, GatedMLP, Norm
from pace_core.models.rope import Rotary
from pace_core.models.weights import WeightStore
from pace_core.opconfig import OpResolver
from pace_core.quant import DENSE, QuantizationConfig, QuantizedWeight, formats_of, quantize

Matrix = torch.Tensor | QuantizedWeight


class ModelBuilder(KernelBinder):
    """Reads weights by name, resolves each op once, and returns bound blocks."""

    def __init__(
        self,
        config: Any,
        weights: WeightStore,
        dtype: torch.dtype,
        resolver: OpResolver,
        cache_layout: str = "contiguous",
        quantization: QuantizationConfig | None = None,
    ) -> None:
        super().__init__(dtype, resolver)
        self.config, self.weights = config, weights
        self.cache_layout = cache_layout
        self.quantization = quantization
        # checkpoint name -> what it became, when asked to record it (saving a quantized copy)
        self.quantized: dict[str, QuantizedWeight] | None = None
        self.matrix_formats: set[str] = set()  # weight formats of the matrix ops bound so far

    def bind(self, op: str, attrs: dict[str, Any], *weights: Any) -> Bound:
        """Resolve ``op``, run its prepare step on ``weights`` and bind the kernel
        (:meth:`KernelBinder.prepared`)."""
        if fmt := attrs.get("weight_format"):
            self.matrix_formats.update(fmt.split("+"))
        kernel, prepared = self.prepared(op, attrs, *weights)
        return Bound(kernel.fn, prepared)

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.weights.take(name, dtype or self.dtype)

    def optional(self, name: str) -> torch.Tensor | None:
        return self.weights.take_optional(name, self.dtype)

    def matrix(self, weight: Matrix, module: str = "", *, head: bool = False) -> Matrix:
        """A weight matrix as the model keeps it: quantized when the load asked for it (and
        ``module`` is not skipped), as the checkpoint stores it otherwise. ``head``: the token
        embedding or LM head (``QuantizationConfig.head_bits``)."""
        q = self.quantization
        if q is None or isinstance(weight, QuantizedWeight) or q.skips(module):
            return weight
        done = quantize(weight, q.for_head() if head else q, name=module)
        if self.quantized is not None:
            self.quantized[f"{module}.weight"] = done
        return done

    def linear(
        self,
        name: str,
        *,
        bias: bool = False,
        weight: Matrix | None = None,
        head: bool = False,
        keep_format: bool = False,
    ) -> Bound:
        """``head``: the LM head (quantized by ``QuantizationConfig.head_bits``);
        ``keep_format``: never quantize on load (MoE routers: tiny, and their top-k choice
        is sensitive to rounding; llama.cpp keeps them in F32 too)."""
        source = self.tensor(f"{name}.weight") if weight is None else weight
        w = source if keep_format else self.matrix(source, name, head=head)
        b = self.tensor(f"{name}.bias") if bias else None
        attrs = {
            "in_features": int(w.shape[-1]),
            "out_features": int(w.shape[0]),
            "weight_format": formats_of([w]),
        }
        return self.bind("linear", attrs, w, b)

    def qkv(
        self,
        names: Sequence[str] = (),
        *,
        bias: bool = False,
        fused: str | None = None,
        sizes: Sequence[int] = (),
    ) -> Bound:
        """Q/K/V from three tensors (a name may repeat: Gemma 4's values are its keys'
        projection), or from one ``fused`` tensor split by ``sizes``."""
        if fused is not None:
            weights = list(self.matrix(self.tensor(f"{fused}.weight"), fused).split(list(sizes)))
            biases = list(self.tensor(f"{fused}.bias").split(list(sizes))) if bias else None
        else:
            unique = dict.fromkeys(names)
            taken = {n: self.matrix(self.tensor(f"{n}.weight"), n) for n in unique}
            weights = [taken[n] for n in names]
            biases = None
            if bias:
                taken_bias = {n: self.tensor(f"{n}.bias") for n in unique}
                biases = [taken_bias[n] for n in names]
        attrs = {"in_features": int(weights[0].shape[-1]), "weight_format": formats_of(weights)}
        return self.bind("qkv_proj", attrs, weights, biases)

    def gated_mlp(
        self, gate: Matrix, up: Matrix, down: Matrix, activation: str, *, module: str = ""
    ) -> GatedMLP:
        """``activation`` is a name of ``pace_core.ops.ACTIVATIONS``; ``module`` names the MLP
        (for quantization's skip list)."""
        gate, up, down = (self.matrix(w, f"{module}.{part}") for w, part in
                          ((gate, "gate_proj"), (up, "up_proj"), (down, "down_proj")))  # fmt: skip
        hidden, intermediate = int(gate.shape[1]), int(gate.shape[0])
        attrs = {
            "activation": activation,
            "hidden": hidden,
            "intermediate": intermediate,
            "weight_format": formats_of([gate, up, down]),
        }
        bound = self.bind("gated_mlp", attrs, gate, up, down, activation)
        return GatedMLP(bound.fn, bound.weight, activation, hidden, intermediate)

    def stack(self, layers: Sequence[Callable]) -> Bound:
        """Bind ``decoder_stack`` to the blocks; the resolver sees what it would fuse."""
        layer_ops = ("linear", "qkv_proj", "gated_mlp", "moe", "rms_norm", "layer_norm", "rope",
                     "attention", "latent_attention")  # fmt: skip
        attrs = {
            # block kinds (``pace_core.stack_spec.BLOCK_KINDS``; a family's own: its class name)
            "blocks": frozenset(getattr(layer, "kind", type(layer).__name__) for layer in layers),
            "layer_backends": frozenset(
                r.backend for r in self.plan.resolutions if r.op in layer_ops
            ),
            "cache_layout": self.cache_layout,
            "profiling": self.profiler is not None,
            "weight_format": "+".join(sorted(self.matrix_formats)) or DENSE,
        }
        return self.bind("decoder_stack", attrs, layers)

    def norm(
        self, name: str, eps: float, *, rms: bool = True, offset: float = 0.0, bias: bool = False
    ) -> Norm:
        """Norm weights stay fp32; Gemma's ``(1 + w)`` is folded in via ``offset``."""
        w = self.weights.take(f"{name}.weight", torch.float32) + offset
        if rms:
            return Norm(self.kernel("rms_norm").fn, w, eps)
        b = self.weights.take(f"{name}.bias", torch.float32) if bias else None
        return Norm(self.kernel("layer_norm").fn, w, eps, b, is_rms=False)

    def unit_norm(self, size: int, eps: float) -> Norm:
        """An RMSNorm without a learned scale (Llama 4's L2 QK-norm)."""
        return Norm(self.kernel("rms_norm").fn, torch.ones(size), eps)

    def attention(
        self,
        *,
        layer: int,
        qkv: Bound,
        o_proj: Bound,
        rotary: Rotary | None,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        window: Window = None,
        **extra: Any,
    ) -> Attention:
        if num_heads % num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        attend = self.kernel(
            "attention",
            head_dim=head_dim,
            gqa=num_heads // num_kv_heads,
            window=window,
            sinks=extra.get("sinks") is not None,
            cache_layout=self.cache_layout,
        ).fn
        rope_fn = self.kernel("rope", head_dim=head_dim).fn if rotary is not None else None
        return Attention(
            qkv=qkv,
            o_proj=o_proj,
            attend=attend,
            rope_fn=rope_fn,
            rotary=rotary,
            layer=layer,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            window=window,
            **extra,
        )
