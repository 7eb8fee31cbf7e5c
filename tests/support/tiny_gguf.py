"""Tiny GGUF files written from tiny Hugging Face checkpoints, as llama.cpp's converter would.

:func:`write_gguf` turns a model directory (``config.json`` + safetensors) of a Llama, Qwen2 or
Gemma 3 into a GGUF file: the ``<arch>.*`` hyper-parameters transformers reads back into a
config (``transformers/integrations/ggml.py``, ``GGUF_CONFIG_MAPPING``), tensors under their
GGUF names (``gguf.get_tensor_name_map``, as the converter), 1-D tensors in F32 and matrices in
the GGUF types asked for, holding the checkpoint's values quantized. The converter's two
transformations are applied: the Q/K row permutation of ``llama`` (``LlamaModel.permute``) and
the ``+ 1`` folded into every Gemma norm weight. No tokenizer is written: transformers only
needs one for the vocabulary size, which ``<arch>.vocab_size`` gives.

Quantizers: ``q8_0``/``q4_0`` from pace (bit-identical to gguf's), ``f16`` by numpy, and every
other type gguf implements (``q4_1``, ``q5_0``, ``q5_1``, ``bf16``, ``mxfp4``, ...) by
``gguf.quants.quantize``. gguf has no quantizers for the k-quants: pace's
``gguf_blocks.quantize_k`` builds valid ``q2_k``..``q6_k`` blocks with a simple (not llama.cpp's
optimal) choice of scales, de-quantized values within about one quantization step.

:data:`TINY` holds one factory per architecture: ``factory(tmp_dir) -> model dir`` with every
row length a multiple of 256 (the k-quant super-block).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers as tf
from safetensors.torch import load_file

from pace_core.quant.gguf_blocks import K_QUANT_WRITERS, quantize_k, quantize_q4_0, quantize_q8_0
from support.tiny import NO_SPECIAL, save

Q = gguf.GGMLQuantizationType
# Hugging Face model_type -> GGUF general.architecture
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3"}

# -- tiny checkpoints whose rows fit the k-quants -------------------------------------------
DIMS = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,  # head_dim 64: q rows 256, o_proj rows of 256
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_llama(tmp_dir: Path) -> Path:
    """Untied head (the GGUF has an ``output`` tensor)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    cfg = tf.LlamaConfig(**DIMS, **NO_SPECIAL, tie_word_embeddings=False, rope_parameters=rope)
    return save(tf.LlamaForCausalLM, cfg, tmp_dir)


def tiny_qwen2(tmp_dir: Path) -> Path:
    """Tied head, Q/K/V biases (llama.cpp's Qwen2 has no sliding window)."""
    cfg = tf.Qwen2Config(**DIMS, **NO_SPECIAL, tie_word_embeddings=True)
    return save(tf.Qwen2ForCausalLM, cfg, tmp_dir)


def tiny_gemma3(tmp_dir: Path) -> Path:
    """QK-norm, sandwich norms, GeGLU, a sliding window of 4. Six layers: GGUF keeps no layer
    pattern, transformers re-derives it (every 6th layer global), so the last one is global."""
    cfg = tf.Gemma3TextConfig(**{**DIMS, "num_hidden_layers": 6}, **NO_SPECIAL, head_dim=64,
                              sliding_window=4)  # fmt: skip
    return save(tf.Gemma3ForCausalLM, cfg, tmp_dir)


TINY: dict[str, Callable[[Path], Path]] = {
    "llama": tiny_llama,
    "qwen2": tiny_qwen2,
    "gemma3": tiny_gemma3,
}


def quantize(w: torch.Tensor, kind: str) -> tuple[np.ndarray, Q]:
    """A float matrix as the raw data of GGUF type ``kind`` (a name: ``"q4_k"``, ``"f16"``)."""
    qtype = Q[kind.upper()]
    if kind == "f32":
        return w.float().numpy(), qtype
    if kind == "f16":
        return w.float().numpy().astype(np.float16), qtype
    if kind in ("q8_0", "q4_0"):
        fn = quantize_q8_0 if kind == "q8_0" else quantize_q4_0
        return fn(w).numpy(), qtype
    if kind in K_QUANT_WRITERS:
        return quantize_k(w, kind).numpy(), qtype
    return gguf.quants.quantize(w.float().numpy(), qtype), qtype


def _type_for(name: str, types: dict[str, str] | str) -> str:
    if isinstance(types, str):
        return types
    for key, kind in types.items():  # the first key that is a substring of the name wins
        if key in name:
            return kind
    raise KeyError(f"no GGUF type given for {name} (add a '' entry for a default)")


def permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: each head's rope halves interleaved row by row."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _metadata(writer: gguf.GGUFWriter, cfg, arch: str) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    rope = rope.get("full_attention", rope)  # gemma3: per layer type; the global one
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    if arch == "gemma3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_sliding_window(cfg.sliding_window)
    else:
        writer.add_rope_dimension_count(head_dim)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_gguf(
    hf_dir: Path,
    out: Path,
    types: dict[str, str] | str,
    *,
    architecture: str | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write the checkpoint in ``hf_dir`` as the GGUF file ``out``.

    ``types`` gives each matrix's GGUF type: one name for all, or a map from substrings of
    GGUF tensor names to names, the first matching key winning (``{"attn_output": "q5_1",
    "output": "q6_k", "": "q4_k"}``: ``""`` matches everything). 1-D tensors are F32.
    ``architecture`` overrides ``general.architecture`` (and the metadata key prefix);
    ``extra`` adds float32 tensors under the given GGUF names (both for error tests).
    """
    hf_dir, out = Path(hf_dir), Path(out)
    model_type = json.loads((hf_dir / "config.json").read_text())["model_type"]
    cfg = tf.AutoConfig.from_pretrained(str(hf_dir))
    arch = ARCHITECTURES[model_type]
    state: dict[str, torch.Tensor] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(file))
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)

    writer = gguf.GGUFWriter(str(out), architecture or arch)
    _metadata(writer, cfg, architecture or arch)
    for hf_name, tensor in state.items():
        module, suffix = hf_name.rsplit(".", 1)
        base = names.get_name(module)
        if base is None:
            raise KeyError(f"no GGUF name for {hf_name} ({arch})")
        name = f"{base}.{suffix}"
        w = tensor.detach().float()
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            w = permute(w, heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1.0
        if w.dim() == 1:
            writer.add_tensor(name, w.numpy())
        else:
            data, qtype = quantize(w, _type_for(name, types))
            writer.add_tensor(name, data, raw_dtype=qtype)
    for name, data in (extra or {}).items():
        writer.add_tensor(name, np.asarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
