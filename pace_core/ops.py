"""The op catalogue: every op a model may call, with the signature its kernels implement.

Kernels are registered per op by plugins (see ``hookspecs.pace_register_ops``). The native
plugin implements all of them; other backends implement any subset.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    """One op of the catalogue: its name, call signature, whether it takes a prepare step and
    whether its kernels call other ops' kernels (a container: profiling times the inner ops)."""

    name: str
    signature: str
    summary: str
    prepared: bool = False
    container: bool = False


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("embedding", "fn(ids[B,T] int64, weight[V,H]) -> [B,T,H]", "token embedding"),
        OpSpec(
            "linear",
            "fn(x[...,K], w) -> [...,N]; w = prepare(weight[N,K], bias[N]|None)",
            "dense projection (also lm_head)",
            prepared=True,
        ),
        OpSpec(
            "qkv_proj",
            "fn(x[...,K], w) -> (q, k, v); w = prepare([wq, wk, wv], [bq, bk, bv]|None)",
            "fused Q/K/V projection",
            prepared=True,
        ),
        OpSpec(
            "gated_mlp",
            "fn(x[...,H], w) -> [...,H]; w = prepare(gate, up, down, activation, limit)",
            "act(x@gate) * (x@up) @ down",
            prepared=True,
        ),
        OpSpec(
            "moe",
            "fn(x[N,H], experts[N,k] int64, weights[N,k], w) -> [N,H]; "
            "w = prepare(gate_up[E,H,2I], gate_up_bias, down[E,I,H], down_bias, alpha, limit)",
            "mixture-of-experts MLP (GPT-OSS clamped SwiGLU with interleaved gate/up)",
            prepared=True,
        ),
        OpSpec(
            "rms_norm",
            "fn(x, weight, eps, residual|None) -> (y, x + residual)",
            "RMSNorm with optional fused residual add",
        ),
        OpSpec(
            "layer_norm",
            "fn(x, weight, bias|None, eps, residual|None) -> (y, x + residual)",
            "LayerNorm with optional fused residual add",
        ),
        OpSpec(
            "rope",
            "fn(q[B,T,Hq,D], k[B,T,Hk,D], cos[B,T,R], sin[B,T,R], interleaved: bool) -> (q, k)",
            "rotary embedding on the first R dims (neox halves or GPT-J interleaved pairs)",
        ),
        OpSpec(
            "attention",
            "fn(q[B,Hq,T,D], kv: cache view, scale, sinks[Hq]|None, window|None) -> [B,Hq,T,D]",
            "attention over the KV cache view (layout-specific), GQA, sliding window, sinks",
        ),
        OpSpec(
            "decoder_stack",
            "fn(x[B,T,H], residual|None, step, w) -> (x, residual); w = prepare(layers)",
            "run the decoder blocks in order (a backend may fuse the whole loop)",
            prepared=True,
            container=True,
        ),
    )
}

# The activations a gated/dense MLP kernel may be asked for: one vocabulary for the core and
# every plugin. A kernel's integer code for an activation is its index here.
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu")

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
