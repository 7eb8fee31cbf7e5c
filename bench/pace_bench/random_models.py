"""Random-weight models with real layer shapes for benchmark rows of families whose real
weights are not obtainable here: ``random:<name>`` in any ``--models`` list.

The weights are N(0, 0.02) in bf16, written once per name under ``~/.cache/pace/random``;
fewer layers than the real model (the per-layer cost is what a row compares), except the
full-depth ``llama-3.2-1b`` and ``llama-3.1-8b`` (scaling: bytes per token as the real ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pace_core.paths import cache_root

PREFIX = "random:"

# name -> (transformers config class, model class, config kwargs)
SHAPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-0.6b-4l": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=40960)),
    "qwen3-30b-a3b-2l": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=40960)),
    # Mistral-7B-v0.3's layer (GQA 32/8, intermediate 14336), 2 layers
    "mistral-7b-2l": ("MistralConfig", "MistralForCausalLM", dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=None,
        tie_word_embeddings=False, max_position_embeddings=32768)),
    # SmolLM3-3B's shapes (NoPE every 4th layer), 4 layers
    "smollm3-3b-4l": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, no_rope_layer_interval=4,
        tie_word_embeddings=True, max_position_embeddings=65536)),
    # Moonlight-16B-A3B (a DeepSeek-V3 architecture): MLA (rank 512 + rope 64, no q_lora),
    # layer 0 dense, layer 1 MoE (64 experts x 1408, top-6, 2 shared)
    "moonlight-16b-a3b-2l": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        vocab_size=163840, hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
        num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, routed_scaling_factor=2.446,
        norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        tie_word_embeddings=False, max_position_embeddings=8192)),
    # transformers' default Gemma4TextConfig shapes (hidden 2304, 8 heads / 4 KV of 256, global
    # heads of 512, per-layer inputs of 256), 6 layers: 5 sliding + 1 global
    "gemma4-text-6l": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
        num_hidden_layers=6, max_position_embeddings=8192,
        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
    # Llama 4 Scout's layer (16 experts + a shared one, top-1, chunked attention, QK-norm);
    # tied embeddings here (Scout's are not) to keep two engines' copies within 24 GB
    "llama4-scout-1l": ("Llama4TextConfig", "Llama4ForCausalLM", dict(
        vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=1, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
        attention_chunk_size=8192, use_qk_norm=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        max_position_embeddings=10485760)),
    # Llama-3.2-1B and Llama-3.1-8B at full depth (pace bench scaling: whole-model bytes)
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        max_position_embeddings=131072)),
    "llama-3.1-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        max_position_embeddings=131072)),
}  # fmt: skip


def is_random_name(name: str) -> bool:
    return str(name).startswith(PREFIX)


def random_model(name: str) -> Path:
    """The directory of ``random:<shape>``, written on first use."""
    import torch
    import transformers

    shape = str(name)[len(PREFIX) :]
    if shape not in SHAPES:
        raise ValueError(f"unknown random model {shape!r}; known: {', '.join(SHAPES)}")
    out = cache_root() / "random" / shape
    if (out / "config.json").is_file():
        return out
    config_cls, model_cls, kwargs = SHAPES[shape]
    config = getattr(transformers, config_cls)(**kwargs, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out
