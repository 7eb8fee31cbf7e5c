"""The op catalogue: every op a model may call, the kernel signature of each, and the facts a
kernel's ``supports`` predicate may read. This is the contract between the core and every
kernel plugin; :data:`CONTRACT_VERSION` names its version.

Kernels are registered per op by plugins (see ``hookspecs.pace_register_ops``). The native
plugin implements all of them; other backends implement any subset. The contract is checked
by code: registering a kernel whose function or prepare step cannot be called with the op's
arguments is an error, and so is a predicate reading a context attribute the op does not
declare.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CONTRACT_VERSION = 1
"""The version of this contract (op signatures, context attributes, hooks, layer
descriptions). A plugin states the version it was written for as ``PACE_CONTRACT_VERSION`` in
its plugin module; the host refuses a plugin written for another version, saying why. Bumped
on any change that breaks existing plugins."""


@dataclass(frozen=True)
class OpSpec:
    """One op of the catalogue.

    ``params``: the positional arguments of a kernel call (``name[shape]``); ``prepare``: the
    arguments of its one-time weight transform, or None when the op has none; ``context``:
    the :class:`~pace_core.registry.OpContext` attributes (besides ``op`` and ``dtype``) a
    ``supports`` predicate may read; ``container``: its kernels call other ops' kernels (the
    profiler times the inner ops instead).
    """

    name: str
    params: tuple[str, ...]
    returns: str
    summary: str
    context: tuple[str, ...] = ()
    prepare: tuple[str, ...] | None = None
    container: bool = False

    @property
    def prepared(self) -> bool:
        return self.prepare is not None

    @property
    def signature(self) -> str:
        text = f"fn({', '.join(self.params)}) -> {self.returns}"
        if self.prepare is not None:
            text += f"; w = prepare({', '.join(self.prepare)})"
        return text

    def call_problem(self, fn: Callable[..., Any], prepare: Callable[..., Any] | None) -> str:
        """Why ``fn`` (and ``prepare``) cannot be called as this op calls them, or ''."""
        for what, callable_, arity in (
            ("kernel", fn, len(self.params)),
            ("prepare step", prepare, len(self.prepare or ())),
        ):
            if callable_ is None:
                continue
            try:
                sig = inspect.signature(callable_)
            except (TypeError, ValueError):  # a C builtin without a signature: cannot check
                continue
            try:
                sig.bind(*range(arity))
            except TypeError as exc:
                return (
                    f"its {what} {sig} cannot take the {arity} positional arguments of op "
                    f"{self.name!r} ({exc}); the catalogue says {self.signature}"
                )
        return ""


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "embedding",
            ("ids[B,T] int64", "weight[V,H]"),
            "[B,T,H]",
            "token embedding",
            context=("vocab", "weight_format"),
        ),
        OpSpec(
            "linear",
            ("x[...,K]", "w"),
            "[...,N]",
            "dense projection (also lm_head)",
            context=("in_features", "out_features", "weight_format"),
            prepare=("weight[N,K]", "bias[N]|None"),
        ),
        OpSpec(
            "qkv_proj",
            ("x[...,K]", "w"),
            "(q, k, v)",
            "fused Q/K/V projection",
            context=("in_features", "weight_format"),
            prepare=("[wq, wk, wv]", "[bq, bk, bv]|None"),
        ),
        OpSpec(
            "gated_mlp",
            ("x[...,H]", "w"),
            "[...,H]",
            "act(x@gate) * (x@up) @ down",
            context=("activation", "hidden", "intermediate", "weight_format"),
            prepare=("gate[I,H]", "up[I,H]", "down[H,I]", "activation"),
        ),
        OpSpec(
            "moe",
            ("x[N,H]", "experts[N,k] int64", "weights[N,k]", "w"),
            "[N,H]",
            "mixture-of-experts MLP: gated experts with gate/up interleaved, activation "
            "'swiglu_oai' (GPT-OSS, clamped) or a gated_mlp one; biases may be None; quantized "
            "experts come as per-expert lists of [2I,H] / [H,I] matrices; weights fp32 or dtype",
            context=(
                "experts", "top_k", "activation", "biases", "hidden", "intermediate",
                "weight_format",
            ),
            prepare=(
                "gate_up[E,H,2I]", "gate_up_bias", "down[E,I,H]", "down_bias", "alpha", "limit",
                "activation",
            ),
        ),
        OpSpec(
            "rms_norm",
            ("x", "weight", "eps", "residual|None"),
            "(y, x + residual)",
            "RMSNorm with optional fused residual add",
        ),
        OpSpec(
            "layer_norm",
            ("x", "weight", "bias|None", "eps", "residual|None"),
            "(y, x + residual)",
            "LayerNorm with optional fused residual add",
        ),
        OpSpec(
            "rope",
            ("q[B,T,Hq,D]", "k[B,T,Hk,D]", "cos[B,T,R]", "sin[B,T,R]", "interleaved: bool"),
            "(q, k)",
            "rotary embedding on the first R dims (neox halves or GPT-J interleaved pairs)",
            context=("head_dim",),
        ),
        OpSpec(
            "attention",
            ("q[B,Hq,T,D]", "kv: cache view", "scale", "sinks[Hq]|None", "window|None"),
            "[B,Hq,T,D]",
            "attention over the KV cache view (layout-specific), GQA, sinks; window: None, a "
            "sliding int or a caches.base.ChunkedWindow (masks from kv.meta.mask(window))",
            context=("head_dim", "gqa", "window", "sinks", "cache_layout", "kv_dtype"),
        ),
        OpSpec(
            "latent_attention",
            ("q[B,H,T,R+P]", "kv: latent cache view", "scale", "rank R", "window|None"),
            "[B,H,T,R]",
            "multi-head latent attention (MLA) over a latent cache: one KV head of "
            "[latent R, rope P] rows, values = their first R dims",
            context=("rank", "rope_dim", "heads", "window", "cache_layout", "kv_dtype"),
        ),
        OpSpec(
            "decoder_stack",
            ("x[B,T,H]", "residual|None", "step", "w"),
            "(x, residual)",
            "run the decoder blocks in order (a backend may fuse the whole loop; with "
            "step.last_only it may return each row's last position only, [B,1,H])",
            context=(
                "blocks",
                "layer_backends",
                "cache_layout",
                "profiling",
                "weight_format",
                "kv_dtype",
            ),
            prepare=("layers",),
            container=True,
        ),
        OpSpec(
            "embedding_bag",
            ("indices[N] int64", "offsets[B+1] int64", "w"),
            "[B,D]",
            "sum-pooled embedding bags (DLRM): bag b sums table rows "
            "indices[offsets[b]:offsets[b+1]] in fp32 (an empty bag is zeros); the table is "
            "dense in the model dtype or int8 with one scale per row (a QuantizedWeight with "
            "group_size D)",
            context=("rows", "dim", "weight_format"),
            prepare=("weight[V,D]",),
        ),
        OpSpec(
            "cross_interaction",
            ("x0[B,D]", "w"),
            "[B,D]",
            "DCNv2 low-rank cross stack (DLRMv2): x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l "
            "from x_0 = x0; layers are (V[r,D], U[D,r], b[D]) tuples, V and U in any weight "
            "format",
            context=("in_features", "rank", "layers", "weight_format"),
            prepare=("layers",),
        ),
    )
}

# The activations a gated/dense MLP kernel may be asked for: one vocabulary for the core and
# every plugin. A kernel's integer code for an activation is its index here.
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu")
# op ``moe``'s: ``act(gate) * up`` with any of the above, or GPT-OSS's clamped SwiGLU
MOE_ACTIVATIONS: tuple[str, ...] = ("swiglu_oai", *ACTIVATIONS)

# Hugging Face ``hidden_act`` / ``hidden_activation`` names -> the vocabulary above.
HF_ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "relu": "relu",
}

# Names a user may write in an OperatorConfig that stand for several ops.
OP_GROUPS: dict[str, tuple[str, ...]] = {"norm": ("rms_norm", "layer_norm")}
