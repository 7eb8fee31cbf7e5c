"""Random-weight models with real layer shapes for benchmark rows of families whose real
weights are not obtainable here: ``random:<name>`` in any ``--models`` list.

The weights are N(0, 0.02) in bf16, written once per name under ``~/.cache/pace/random``;
fewer layers than the real model (the per-layer cost is what a row compares), except the
full-depth ``llama-3.2-1b``, ``llama-3.2-3b`` and ``llama-3.1-8b`` (scaling and loading: bytes
as the real ones). The 3B and 8B are written shard by shard (:data:`STREAMED`: never the whole
model in memory). :func:`random_gguf` makes llama.cpp GGUF files of them (Q8_0, Q4_K_M, ...),
with a placeholder vocabulary (the checkpoints have no tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pace_core.errors import ConfigError
from pace_core.paths import cache_root

PREFIX = "random:"


def llama3_rope(factor: float) -> dict:
    """Llama 3's rope scaling (theta 500k, original context 8192) with ``factor``."""
    return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}  # fmt: skip


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
        rope_parameters=llama3_rope(16.0),
        max_position_embeddings=10485760)),
    # Llama-3.2-1B and Llama-3.1-8B at full depth (pace bench scaling: whole-model bytes)
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
        rope_parameters=llama3_rope(32.0),
        max_position_embeddings=131072)),
    "llama-3.2-3b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        rope_parameters=llama3_rope(32.0),
        max_position_embeddings=131072)),
    "llama-3.1-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
        rope_parameters=llama3_rope(8.0),
        max_position_embeddings=131072)),
}  # fmt: skip


STREAMED = ("llama-3.2-3b", "llama-3.1-8b")
"""Shapes written a shard at a time with random values of their own (not transformers')."""
SHARD_BYTES = 2 << 30


def is_random_name(name: str) -> bool:
    return str(name).startswith(PREFIX)


def random_model(name: str) -> Path:
    """The directory of ``random:<shape>``, written on first use."""
    import torch
    import transformers

    shape = str(name)[len(PREFIX) :]
    if shape not in SHAPES:
        raise ConfigError(f"unknown random model {shape!r}; known: {', '.join(SHAPES)}")
    out = cache_root() / "random" / shape
    if (out / "config.json").is_file():
        return out
    config_cls, model_cls, kwargs = SHAPES[shape]
    config = getattr(transformers, config_cls)(**kwargs, bos_token_id=None, eos_token_id=None)
    if shape in STREAMED:
        _write_streamed(config, getattr(transformers, model_cls), out)
        return out
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


def _write_streamed(config: Any, model_cls: Any, out: Path) -> None:
    """The checkpoint of ``model_cls(config)`` in bf16 safetensors shards of
    :data:`SHARD_BYTES`, each made and written on its own (N(0, 0.02) matrices, norms 1)."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file

    with torch.device("meta"):
        model = model_cls(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            t = torch.empty(shapes[name], dtype=torch.bfloat16)
            tensors[name] = t.normal_(0.0, 0.02, generator=gen) if t.dim() > 1 else t.fill_(1.0)
            weight_map[name] = file
        save_file(tensors, str(tmp / file), metadata={"format": "pt"})
        del tensors
    total = sum(2 * int(torch.Size(s).numel()) for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config.torch_dtype = "bfloat16"
    config.architectures = [model_cls.__name__]
    config.save_pretrained(str(tmp))
    tmp.rename(out)


_CONVERT = """
import sys
here, args = sys.argv[1], sys.argv[2:]
sys.path[:0] = [here, here + "/gguf-py"]
sys.argv = ["convert_hf_to_gguf.py", *args]
import convert_hf_to_gguf
from conversion import llama

def placeholder_vocab(self):
    n = self.hparams["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n - len(tokens))]
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

llama.LlamaModel.set_vocab = placeholder_vocab
convert_hf_to_gguf.main()
"""


VIA_Q8_0 = ("llama-3.1-8b",)
"""Shapes converted to Q8_0 (not BF16) before llama.cpp's quantizer re-quantizes them: a 16 GB
BF16 GGUF next to the 16 GB checkpoint does not fit a 28 GB disk; the Q8_0 file (8.5 GB) is
kept as the shape's ``q8_0`` GGUF."""


def random_gguf(name: str, ftype: str) -> Path:
    """``random:<shape>`` as a GGUF file of llama.cpp's ``ftype`` (``q8_0``, ``q4_k_m``, ...:
    :data:`pace_bench.peers.LLAMA_FTYPES`), made once next to the checkpoint: converted to
    BF16 (Q8_0 for :data:`VIA_Q8_0`) by llama.cpp's converter (a placeholder vocabulary of the
    model's size), quantized by llama.cpp's own quantizer, a BF16 intermediate deleted. Needs
    ``make bench-peers`` or ``make bench-llama-cpp``."""
    import os
    import subprocess
    import sys

    from pace_bench import peers

    model_dir = random_model(name)
    out = model_dir / f"{model_dir.name}.{ftype}.gguf"
    if out.is_file():
        return out
    if ftype not in peers.LLAMA_FTYPES:
        raise ValueError(
            f"unknown llama.cpp ftype {ftype!r}; known: {', '.join(peers.LLAMA_FTYPES)}"
        )
    script = peers.find_converter()
    if script is None:
        raise peers.PeerUnavailable("llama.cpp's converter is missing: run `make bench-peers` "
                                    "or `make bench-llama-cpp`")  # fmt: skip
    peers.require_quantizer()
    via = "q8_0" if model_dir.name in VIA_Q8_0 else "bf16"
    source = model_dir / f"{model_dir.name}.{via}.gguf"
    if not source.is_file():
        tmp = source.with_suffix(".tmp")
        cmd = [sys.executable, "-c", _CONVERT, str(script.parent), str(model_dir), "--outfile",
               str(tmp), "--outtype", via]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"GGUF conversion of {model_dir} failed: {done.stderr[-2000:]}")
        tmp.replace(source)
    if source == out:
        return out
    try:
        peers.quantize_gguf(source, out, ftype, requantize=via != "bf16")
    finally:
        if via == "bf16":
            source.unlink(missing_ok=True)
    return out
