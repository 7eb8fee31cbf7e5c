"""Tiny random-weight checkpoints, one factory per family variant, for parity tests.

``FACTORIES`` maps a variant name to ``factory(tmp_dir) -> model_dir``: the factory builds a
transformers config, randomizes every parameter (biases and norm weights too, so they are
exercised), and ``save_pretrained``s safetensors into ``tmp_dir``. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers as tf

SEED = 0
# Shared shape of every tiny model: 4 heads of 16, GQA 2 where the family supports it.
DIMS = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
# No EOS: greedy runs must produce all their tokens in both HF and pace.
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def randomize(model: torch.nn.Module, std: float = 0.15) -> None:
    """Re-draw all parameters: matrices N(0, std), biases N(0, 0.1), norm weights 1 + N(0, 0.1).

    A larger std than HF's init keeps greedy margins well above fp32 noise.
    """
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() > 1:
                p.copy_(noise * std)
            elif name.endswith("bias"):
                p.copy_(noise * 0.1)
            else:
                p.copy_(1 + noise * 0.1)


def save(model_cls: type, config: Any, tmp_dir: Path) -> Path:
    torch.manual_seed(SEED)
    model = model_cls(config).eval()
    randomize(model)
    model.save_pretrained(tmp_dir, safe_serialization=True)
    return Path(tmp_dir)


def odd_llama(tmp_dir: Path) -> Path:
    """A 2-layer Llama whose sizes are not multiples of the kernels' blocks (16, 32, 64):
    hidden 96 (6 heads of 16, 2 KV heads: fused QKV N = 160), intermediate 200, vocab 250."""
    cfg = tf.LlamaConfig(
        vocab_size=250, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False, **NO_SPECIAL,
    )  # fmt: skip
    return save(tf.LlamaForCausalLM, cfg, tmp_dir)


# -- Llama ---------------------------------------------------------------------------------
def _llama(rope: dict | None = None, **over: Any) -> Callable[[Path], Path]:
    def factory(tmp_dir: Path) -> Path:
        params = {"rope_type": "default", "rope_theta": 10000.0, **(rope or {})}
        cfg = tf.LlamaConfig(**{**DIMS, **NO_SPECIAL, "rope_parameters": params, **over})
        return save(tf.LlamaForCausalLM, cfg, tmp_dir)

    return factory


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


# -- Qwen2: layers >= max_window_layers slide over the last 4 tokens ---------------------------
def qwen2(tmp_dir: Path) -> Path:
    cfg = tf.Qwen2Config(
        **{
            **DIMS,
            **NO_SPECIAL,
            "num_hidden_layers": 3,
            "use_sliding_window": True,
            "sliding_window": 4,
            "max_window_layers": 1,
        }
    )
    assert cfg.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    return save(tf.Qwen2ForCausalLM, cfg, tmp_dir)


# -- Qwen3: QK-norm, head_dim 24 (q 96 != hidden 64), layers >= max_window_layers slide -----
def qwen3(tmp_dir: Path) -> Path:
    cfg = tf.Qwen3Config(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 3},
        head_dim=24,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
    assert cfg.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    return save(tf.Qwen3ForCausalLM, cfg, tmp_dir)


# -- Qwen3-MoE: 6 experts, top-2, renormalised; layer 1 dense (mlp_only_layers) -------------
def qwen3_moe(tmp_dir: Path) -> Path:
    cfg = tf.Qwen3MoeConfig(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 3},
        head_dim=24,
        moe_intermediate_size=40,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    )
    return save(tf.Qwen3MoeForCausalLM, cfg, tmp_dir)


# -- Llama 4 text: rope layers 0, 2 chunked (8) with L2 QK-norm, NoPE layers 1, 3 full with
# temperature tuning from position 3 on; MoE (5 experts, top-2, shared expert) on layers 1, 2
def llama4(tmp_dir: Path) -> Path:
    cfg = tf.Llama4TextConfig(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 4, "intermediate_size": 40},
        head_dim=16,
        intermediate_size_mlp=96,
        num_local_experts=5,
        num_experts_per_tok=2,
        moe_layers=[1, 2],
        no_rope_layer_interval=2,
        attention_chunk_size=8,
        floor_scale=4,
        attn_scale=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    assert cfg.layer_types == ["chunked_attention", "full_attention"] * 2
    return save(tf.Llama4ForCausalLM, cfg, tmp_dir)


# -- DeepSeek-V3: latent attention (rank 32 + rope 8), layer 0 dense, 8 experts in 4 groups
# (best 2 groups eligible), top-2, a shared expert, yarn x4 with mscale_all_dim
def _deepseek_v3(**over: Any) -> Callable[[Path], Path]:
    def factory(tmp_dir: Path) -> Path:
        yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}  # fmt: skip
        cfg = tf.DeepseekV3Config(
            **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 3, "num_key_value_heads": 4},
            moe_intermediate_size=24, first_k_dense_replace=1, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=32,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, rope_parameters=yarn,
            tie_word_embeddings=False, **over,
        )  # fmt: skip
        return save(tf.DeepseekV3ForCausalLM, cfg, tmp_dir)

    return factory


# -- Gemma 4 text: sliding layers (window 4, head 16) and global ones (head 32, proportional
# rope); "gemma4" also has per-layer inputs, K=V globals with 1 KV head, the last 2 layers
# sharing KV (double-wide MLPs), an MoE block (4 experts, top-2) and a final softcap
def _gemma4_text_config(**over: Any) -> Any:
    sliding, full = "sliding_attention", "full_attention"
    return tf.Gemma4TextConfig(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 6, "intermediate_size": 96, **over},
        vocab_size_per_layer_input=DIMS["vocab_size"], head_dim=16, global_head_dim=32,
        layer_types=[sliding, sliding, full, sliding, sliding, full], sliding_window=4,
    )  # fmt: skip


def _gemma4(**over: Any) -> Callable[[Path], Path]:
    def factory(tmp_dir: Path) -> Path:
        return save(tf.Gemma4ForCausalLM, _gemma4_text_config(**over), tmp_dir)

    return factory


GEMMA4_ALL = dict(
    num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=8,
    num_kv_shared_layers=2, use_double_wide_mlp=True, enable_moe_block=True, num_experts=4,
    top_k_experts=2, moe_intermediate_size=32, final_logit_softcapping=30.0,
)  # fmt: skip


# -- Mistral: a window of 6 on every layer ---------------------------------------------------
def mistral(tmp_dir: Path) -> Path:
    cfg = tf.MistralConfig(**{**DIMS, **NO_SPECIAL}, sliding_window=6)
    return save(tf.MistralForCausalLM, cfg, tmp_dir)


# -- SmolLM3: NoPE on every 2nd layer (layers 1 and 3 of 4) ----------------------------------
def smollm3(tmp_dir: Path) -> Path:
    cfg = tf.SmolLM3Config(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 4}, no_rope_layer_interval=2
    )
    assert cfg.no_rope_layers == [1, 0, 1, 0]
    return save(tf.SmolLM3ForCausalLM, cfg, tmp_dir)


# -- Phi-3: half the head dim rotates; longrope switches to long factors past 16 tokens --------
def _phi3(rope: dict, **over: Any) -> Callable[[Path], Path]:
    def factory(tmp_dir: Path) -> Path:
        params = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, **rope}
        cfg = tf.Phi3Config(**{**DIMS, **NO_SPECIAL, "rope_parameters": params, **over})
        return save(tf.Phi3ForCausalLM, cfg, tmp_dir)

    return factory


LONGROPE = {
    "rope_type": "longrope",
    "original_max_position_embeddings": 16,
    "short_factor": [1.0, 1.2, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
}


# -- OPT: pre-norm (125m style) and post-norm with project_in/out (350m style) ---------------
def _opt(**over: Any) -> Callable[[Path], Path]:
    def factory(tmp_dir: Path) -> Path:
        cfg = tf.OPTConfig(
            vocab_size=160,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **NO_SPECIAL,
            **over,
        )
        return save(tf.OPTForCausalLM, cfg, tmp_dir)

    return factory


# -- GPT-J: rotary on 8 of 16 head dims -------------------------------------------------------
def gptj(tmp_dir: Path) -> Path:
    cfg = tf.GPTJConfig(
        vocab_size=160,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        rotary_dim=8,
        n_positions=64,
        **NO_SPECIAL,
    )
    return save(tf.GPTJForCausalLM, cfg, tmp_dir)


# -- Gemma 3: local (window 4) and global layers with their own rope, QK-norm, GeGLU --------
def gemma3(tmp_dir: Path) -> Path:
    cfg = tf.Gemma3TextConfig(
        **{**DIMS, "num_hidden_layers": 3},
        head_dim=32,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        **NO_SPECIAL,
    )
    return save(tf.Gemma3ForCausalLM, cfg, tmp_dir)


# -- GPT-OSS: MoE (4 experts, top-2), sinks, sliding window 4 on layer 0, yarn rope -----------
def gpt_oss(tmp_dir: Path) -> Path:
    cfg = tf.GptOssConfig(
        **{**DIMS, "intermediate_size": 64, "max_position_embeddings": 256},
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        **NO_SPECIAL,
    )
    return save(tf.GptOssForCausalLM, cfg, tmp_dir)


# -- Gemma 3 ConditionalGeneration (not a FACTORIES variant: the parity tests load those with
# transformers' causal-LM classes): the Gemma 3 text model (under language_model.model.) next
# to a one-layer SigLIP vision tower and its projector
def gemma3_conditional(tmp_dir: Path) -> Path:
    text = tf.Gemma3TextConfig(
        **{**DIMS, "num_hidden_layers": 2}, head_dim=32, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
        **NO_SPECIAL,
    )  # fmt: skip
    vision = tf.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=16,
    )  # fmt: skip
    cfg = tf.Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4
    )
    return save(tf.Gemma3ForConditionalGeneration, cfg, tmp_dir)


# -- Llama 4 ConditionalGeneration (not a FACTORIES variant either): a 2-layer Llama 4 text
# model (layer 1 MoE, 3 experts, top-1) under language_model., a one-layer vision model
def llama4_conditional(tmp_dir: Path) -> Path:
    text = tf.Llama4TextConfig(
        **{**DIMS, **NO_SPECIAL, "num_hidden_layers": 2, "intermediate_size": 40}, head_dim=16,
        intermediate_size_mlp=96, num_local_experts=3, num_experts_per_tok=1, moe_layers=[1],
        no_rope_layer_interval=2, attention_chunk_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    vision = tf.Llama4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=16, vision_output_dim=32, projector_input_dim=32,
        projector_output_dim=32,
    )  # fmt: skip
    cfg = tf.Llama4Config(text_config=text.to_dict(), vision_config=vision.to_dict())
    return save(tf.Llama4ForConditionalGeneration, cfg, tmp_dir)


# -- Gemma 4 ConditionalGeneration (not a FACTORIES variant either): the "gemma4" text model
# (pad id 0: transformers' forward masks image tokens with it) under model.language_model.,
# a one-layer vision tower
def gemma4_conditional(tmp_dir: Path) -> Path:
    text = _gemma4_text_config(**GEMMA4_ALL, pad_token_id=0)
    vision = tf.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    cfg = tf.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict())
    return save(tf.Gemma4ForConditionalGeneration, cfg, tmp_dir)


FACTORIES: dict[str, Callable[[Path], Path]] = {
    "llama": _llama(),
    "llama-llama3": _llama(LLAMA3),
    "llama-linear": _llama({"rope_type": "linear", "factor": 2.0}),
    # max 30 positions: a 32-token prompt rescales, 8 + 20 generated tokens stay below.
    "llama-dynamic": _llama({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=30),
    "llama-yarn": _llama(YARN),
    "qwen2-sliding": qwen2,
    "qwen3-sliding": qwen3,
    "qwen3-moe": qwen3_moe,
    "llama4": llama4,
    "deepseek-v3": _deepseek_v3(q_lora_rank=24),
    "deepseek-v3-q-proj": _deepseek_v3(q_lora_rank=None),  # V2-Lite style: q_proj directly
    "mistral-sliding": mistral,
    "smollm3-nope": smollm3,
    "phi3-partial-sliding": _phi3({"rope_type": "default"}, sliding_window=6),
    "phi3-longrope": _phi3(LONGROPE, original_max_position_embeddings=16),
    "opt-prenorm": _opt(),
    "opt-postnorm-project": _opt(do_layer_norm_before=False, word_embed_proj_dim=32),
    "gptj": gptj,
    "gemma3": gemma3,
    "gpt-oss": gpt_oss,
    "gemma4": _gemma4(**GEMMA4_ALL),
    "gemma4-dense": _gemma4(hidden_size_per_layer_input=0, num_kv_shared_layers=0),
}
