"""A checkpoint's tensor shapes against the ones its config implies, before anything is built.

The families read weights by name and trust their sizes; a tensor of the wrong shape (a broken
conversion, a config.json that belongs to another checkpoint) would otherwise be bound as is:
a raw shape error deep in a kernel, or, where a fused kernel takes the config's sizes, a model
that reads past its weights and generates garbage. transformers refuses such checkpoints when
it loads them; so does pace for the dense decoders whose every layer has the config's sizes
(the GGUF architectures among them, Phi-3, OPT and GPT-J), Qwen3-MoE, DeepSeek-V3, GPT-OSS
(dense or MXFP4 experts), Llama 4 and Gemma 4 (layer by layer), and for the text model of a
multimodal checkpoint (by its ``text_config``), from the config alone: no model code is
imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pace_core.errors import ModelLoadError
from pace_core.models.text_part import text_name
from pace_core.models.weights import WeightStore

SHOWN = 5  # mismatches named in the error
# model types whose layers all take the config's sizes (no per-layer widths, no experts)
UNIFORM = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "smollm3", "phi3")
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"\bexperts\.\d+\.")  # one expert's tensors: checked alike

Shape = tuple[int, ...]
LayerShapes = Callable[[int], dict[str, Shape]]
"""A layer's index -> its tensors' shapes by name within the layer."""
Table = tuple[dict[str, Shape], re.Pattern[str], LayerShapes]
"""A family's top-level shapes, the pattern of its layer tensors' names (group 1: the layer's
index, group 2: the name within the layer) and each layer's shapes."""


def _every_layer(shapes: dict[str, Shape]) -> LayerShapes:
    """The same shapes for every layer."""
    return lambda index: shapes


def _gated_mlp(prefix: str, inter: int, hidden: int) -> dict[str, Shape]:
    """A gated MLP's three matrices under ``prefix``."""
    return {f"{prefix}.gate_proj.weight": (inter, hidden),
            f"{prefix}.up_proj.weight": (inter, hidden),
            f"{prefix}.down_proj.weight": (hidden, inter)}  # fmt: skip


def _routed_experts(hidden: int, inter: int, experts: int) -> dict[str, Shape]:
    """A router and its experts, one gated MLP each (``experts.*``) or fused ``[E, 2I, H]``
    / ``[E, H, I]``."""
    return {"mlp.gate.weight": (experts, hidden), **_gated_mlp("mlp.experts.*", inter, hidden),
            "mlp.experts.gate_up_proj": (experts, 2 * inter, hidden),
            "mlp.experts.down_proj": (experts, hidden, inter)}  # fmt: skip


def _top(cfg: Any) -> dict[str, Shape]:
    """The Llama layout's embedding, LM head and final norm."""
    return {
        "model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size),
        "lm_head.weight": (cfg.vocab_size, cfg.hidden_size),
        "model.norm.weight": (cfg.hidden_size,),
    }


def _attention(hidden: int, heads: int, kv: int, dim: int) -> dict[str, Shape]:
    """The Llama attention's projections (weights, and biases where a model has them) and
    QK-norms for ``heads`` query and ``kv`` key / value heads of ``dim``."""
    q, k = heads * dim, kv * dim
    out: dict[str, Shape] = {"self_attn.q_norm.weight": (dim,), "self_attn.k_norm.weight": (dim,)}
    for proj, rows, cols in (("q_proj", q, hidden), ("k_proj", k, hidden), ("v_proj", k, hidden),
                             ("o_proj", hidden, q)):  # fmt: skip
        out[f"self_attn.{proj}.weight"], out[f"self_attn.{proj}.bias"] = (rows, cols), (rows,)
    return out


def _layer_shapes(cfg: Any) -> dict[str, Shape]:
    """Per-layer tensor name (after ``model.layers.N.``) -> its shape."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    dim = getattr(cfg, "head_dim", None) or hidden // heads
    out: dict[str, Shape] = {
        **_attention(hidden, heads, kv, dim), **_gated_mlp("mlp", inter, hidden),
        "self_attn.qkv_proj.weight": ((heads + 2 * kv) * dim, hidden),  # Phi-3's fused ones
        "mlp.gate_up_proj.weight": (2 * inter, hidden),
    }  # fmt: skip
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):  # fmt: skip
        out[f"{norm}.weight"] = (hidden,)
    return out


def _uniform(cfg: Any) -> Table:
    """The Llama layout (and its fused Phi-3 form): every layer at the config's sizes."""
    return _top(cfg), _LAYER, _every_layer(_layer_shapes(cfg))


def _opt(cfg: Any) -> Table:
    """OPT: biased projections and LayerNorms, learned positions (offset 2), an optional
    projection between the embedding width and the hidden size; names under
    ``model.decoder.`` (OPTForCausalLM) or ``decoder.`` (the original facebook/opt files)."""
    h, ffn, emb = cfg.hidden_size, cfg.ffn_dim, cfg.word_embed_proj_dim
    decoder: dict[str, Shape] = {
        "embed_tokens.weight": (cfg.vocab_size, emb),
        "embed_positions.weight": (cfg.max_position_embeddings + 2, h),
        "project_in.weight": (h, emb), "project_out.weight": (emb, h),
        "final_layer_norm.weight": (h,), "final_layer_norm.bias": (h,),
    }  # fmt: skip
    top: dict[str, Shape] = {"lm_head.weight": (cfg.vocab_size, emb)}
    for root in ("model.decoder.", "decoder."):
        top |= {root + name: shape for name, shape in decoder.items()}
    layer: dict[str, Shape] = {"fc1.weight": (ffn, h), "fc1.bias": (ffn,), "fc2.weight": (h, ffn),
                               "fc2.bias": (h,)}  # fmt: skip
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        layer[f"self_attn.{proj}.weight"], layer[f"self_attn.{proj}.bias"] = (h, h), (h,)
    for norm in ("self_attn_layer_norm", "final_layer_norm"):
        layer[f"{norm}.weight"] = layer[f"{norm}.bias"] = (h,)
    return top, re.compile(r"(?:model\.)?decoder\.layers\.(\d+)\.(.+)"), _every_layer(layer)


def _gptj(cfg: Any) -> Table:
    """GPT-J: one LayerNorm per block, unbiased attention, biased MLP and LM head."""
    h, inner = cfg.n_embd, getattr(cfg, "n_inner", None) or 4 * cfg.n_embd
    top: dict[str, Shape] = {
        "transformer.wte.weight": (cfg.vocab_size, h), "lm_head.weight": (cfg.vocab_size, h),
        "lm_head.bias": (cfg.vocab_size,), "transformer.ln_f.weight": (h,),
        "transformer.ln_f.bias": (h,),
    }  # fmt: skip
    layer: dict[str, Shape] = {
        "ln_1.weight": (h,), "ln_1.bias": (h,), "mlp.fc_in.weight": (inner, h),
        "mlp.fc_in.bias": (inner,), "mlp.fc_out.weight": (h, inner), "mlp.fc_out.bias": (h,),
    }  # fmt: skip
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        layer[f"attn.{proj}.weight"] = (h, h)
    return top, re.compile(r"transformer\.h\.(\d+)\.(.+)"), _every_layer(layer)


def _qwen3_moe(cfg: Any) -> Table:
    """Qwen3-MoE: Qwen3's attention; a router and experts of ``moe_intermediate_size`` (per
    expert, or fused ``[E, 2I, H]`` / ``[E, H, I]``) or, on its dense layers, Qwen3's MLP."""
    routed = _routed_experts(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts)
    return _top(cfg), _LAYER, _every_layer(_layer_shapes(cfg) | routed)


def _gpt_oss(cfg: Any) -> Table:
    """GPT-OSS: the Llama attention with biases and per-head sinks, a biased router, experts
    fused as ``[E, H, 2I]`` / ``[E, I, H]`` with biases, or as MXFP4 ``_blocks`` / ``_scales``
    of the transposed matrices (32 values a block, 16 bytes)."""
    h, inter, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    layer = _layer_shapes(cfg) | {
        "self_attn.sinks": (cfg.num_attention_heads,), "mlp.router.weight": (e, h),
        "mlp.router.bias": (e,), "mlp.experts.gate_up_proj": (e, h, 2 * inter),
        "mlp.experts.gate_up_proj_bias": (e, 2 * inter),
        "mlp.experts.down_proj": (e, inter, h), "mlp.experts.down_proj_bias": (e, h),
    }  # fmt: skip
    for name, rows, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
        layer[f"mlp.experts.{name}_blocks"] = (e, rows, k // 32, 16)
        layer[f"mlp.experts.{name}_scales"] = (e, rows, k // 32)
    return _top(cfg), _LAYER, _every_layer(layer)


def _llama4_text(cfg: Any) -> Table:
    """Llama 4's text model: Llama attention; dense layers' MLP of ``intermediate_size_mlp``,
    MoE layers' router, experts fused as ``[E, H, 2I]`` / ``[E, I, H]`` and shared expert of
    ``intermediate_size``, all under ``feed_forward``."""
    h, inter, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    layer = {
        name: shape for name, shape in _layer_shapes(cfg).items() if not name.startswith("mlp.")
    }
    layer |= {
        **_gated_mlp("feed_forward", cfg.intermediate_size_mlp, h),
        **_gated_mlp("feed_forward.shared_expert", inter, h),
        "feed_forward.router.weight": (e, h),
        "feed_forward.experts.gate_up_proj": (e, h, 2 * inter),
        "feed_forward.experts.down_proj": (e, inter, h),
    }
    return _top(cfg), _LAYER, _every_layer(layer)


def _gemma4_text(cfg: Any) -> Table:
    """Gemma 4's text model, layer by layer: each layer's head size and KV heads
    (``per_layer_config``); layers that reuse another's KV (``kv_sharing_modes``) have no key
    or value projections and, with ``use_double_wide_mlp``, an MLP twice as wide; global layers
    with ``attention_k_eq_v`` no value projection; optional per-layer inputs and MoE block."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    per_input = cfg.hidden_size_per_layer_input or 0

    def layer(i: int) -> dict[str, Shape]:
        dim, kv = cfg.per_layer_config[i].head_dim, cfg.per_layer_config[i].num_key_value_heads
        reuses_kv = cfg.kv_sharing_modes[i] == "reuse"
        k_is_v = cfg.attention_k_eq_v and cfg.layer_types[i] != "sliding_attention"
        absent = ("k_proj", "k_norm", "v_proj") if reuses_kv else ("v_proj",) if k_is_v else ()
        out = {name: shape for name, shape in _attention(h, heads, kv, dim).items()
               if name.split(".")[1] not in absent}  # fmt: skip
        out["layer_scalar"] = (1,)
        wide = 2 if cfg.use_double_wide_mlp and reuses_kv else 1
        out |= _gated_mlp("mlp", cfg.intermediate_size * wide, h)
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]  # fmt: skip
        if per_input:
            norms.append("post_per_layer_input_norm")
            out["per_layer_input_gate.weight"] = (per_input, h)
            out["per_layer_projection.weight"] = (h, per_input)
        if cfg.enable_moe_block:  # experts fused [E, 2I, H] / [E, H, I], or one by one
            e, mi = cfg.num_experts, cfg.moe_intermediate_size
            norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                      "pre_feedforward_layernorm_2"]  # fmt: skip
            out |= {"router.proj.weight": (e, h), "router.scale": (h,),
                    "router.per_expert_scale": (e,), "experts.gate_up_proj": (e, 2 * mi, h),
                    "experts.down_proj": (e, h, mi), **_gated_mlp("experts.*", mi, h)}  # fmt: skip
        return out | {f"{norm}.weight": (h,) for norm in norms}

    layers = [layer(i) for i in range(cfg.num_hidden_layers)]

    top = _top(cfg)
    if per_input:
        width = cfg.num_hidden_layers * per_input  # every layer's input, side by side
        top |= {
            "model.embed_tokens_per_layer.weight": (cfg.vocab_size_per_layer_input, width),
            "model.per_layer_model_projection.weight": (width, h),
            "model.per_layer_projection_norm.weight": (per_input,),
        }
    return top, _LAYER, lambda i: layers[i] if i < len(layers) else {}


def _deepseek_v3(cfg: Any) -> Table:
    """DeepSeek-V3: latent attention (a low-rank query when ``q_lora_rank`` is set, else
    ``q_proj``), dense MLPs on the first ``first_k_dense_replace`` layers, then a router with
    its score bias, shared experts and routed experts of ``moe_intermediate_size``."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    kv, mi, e = cfg.kv_lora_rank, cfg.moe_intermediate_size, cfg.n_routed_experts
    layer: dict[str, Shape] = {
        "self_attn.kv_a_proj_with_mqa.weight": (kv + cfg.qk_rope_head_dim, h),
        "self_attn.kv_a_layernorm.weight": (kv,),
        "self_attn.kv_b_proj.weight": (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), kv),
        "self_attn.o_proj.weight": (h, heads * cfg.v_head_dim),
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        **_gated_mlp("mlp", cfg.intermediate_size, h), **_routed_experts(h, mi, e),
        "mlp.gate.e_score_correction_bias": (e,),
        **_gated_mlp("mlp.shared_experts", mi * cfg.n_shared_experts, h),
    }  # fmt: skip
    if cfg.q_lora_rank:
        q = cfg.q_lora_rank
        layer |= {"self_attn.q_a_proj.weight": (q, h), "self_attn.q_a_layernorm.weight": (q,),
                  "self_attn.q_b_proj.weight": (heads * qk, q)}  # fmt: skip
    else:
        layer["self_attn.q_proj.weight"] = (heads * qk, h)
    return _top(cfg), _LAYER, _every_layer(layer)


SHAPE_TABLES: dict[str, Callable[[Any], Table]] = {
    **dict.fromkeys(UNIFORM, _uniform), "opt": _opt, "gptj": _gptj, "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3, "gpt_oss": _gpt_oss, "llama4_text": _llama4_text,
    "gemma4_text": _gemma4_text,
}  # fmt: skip
"""model_type -> its shape table from a config."""


def expected_shape(cfg: Any) -> Callable[[str], Shape | None]:
    """``name -> shape`` the config implies (None: a name this check does not know)."""
    family = SHAPE_TABLES.get(getattr(cfg, "model_type", None))
    text_config = getattr(cfg, "text_config", None)
    if family is None and text_config is not None:  # a multimodal checkpoint: its text model
        text = expected_shape(text_config)
        return lambda name: text(text_name(name) or name)
    if family is None:
        return lambda name: None
    top, pattern, layer = family(cfg)

    def shape(name: str) -> Shape | None:
        m = pattern.fullmatch(name)
        if m is None:
            return top.get(name)
        return layer(int(m.group(1))).get(_EXPERT.sub("experts.*.", m.group(2)))

    return shape


def check_shapes(weights: WeightStore, config: Any) -> None:
    """ModelLoadError naming the tensors of ``weights`` whose shape differs from the one
    ``config`` implies (names it does not know are left to the builder's checks)."""
    expected = expected_shape(config)
    bad = [
        (name, shape, want)
        for name, shape in weights.shapes().items()
        if (want := expected(name)) is not None and want != shape
    ]
    if not bad:
        return
    shown = "; ".join(f"{n} is {list(s)}, expected {list(e)}" for n, s, e in bad[:SHOWN])
    more = f" (and {len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
    raise ModelLoadError(
        f"{weights.source}: {len(bad)} tensor(s) do not have the shape the model's config "
        f"({config.model_type}) implies: {shown}{more}. The file does not match its config: "
        "re-convert or re-download it, or use the config.json it was made with"
    )
