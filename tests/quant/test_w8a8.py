"""``quantization="w8a8"``: per-channel int8 weights and dynamic int8 activations.

The preset marks every quantized matrix W8A8 (``QuantizedWeight.activations == "int8"``), the
LM head included. The native reference rounds the activations of every W8A8 matmul as the
kernels do (linear, fused QKV, gated MLP; per row and group of the weight's
``activation_group``), and pace-avx512's W8A8 kernels agree with it at model level in fp32
(KL <= 1e-5 per position), one op at a time and in its fused decoder stack alike.
"""

from __future__ import annotations

import pytest
import torch
from support.tiny import FACTORIES

from pace_core import LLMModel
from pace_core.cpu import detect_cpu
from pace_core.errors import ConfigError
from pace_core.quant import QuantizationConfig, QuantizedWeight, coerce_quantization, quantize


def test_the_preset_is_per_channel_int8_with_int8_activations():
    q = coerce_quantization("w8a8")
    assert (q.bits, q.group_size, q.activations) == (8, 0, "int8")
    assert q.for_head() == q  # int8 heads are quantized like the other matrices
    assert q.name == "int8-a8"
    w = quantize(torch.randn(16, 64), q)
    assert w.activations == "int8" and w.group_size == 64
    assert QuantizationConfig.from_json(q.to_json()) == q


@pytest.mark.parametrize(
    "fields, match",
    [({"bits": 4, "group_size": 32, "activations": "int8"}, "need int8 weights"),
     ({"activations": "fp8"}, "activations='fp8' unsupported")],
)  # fmt: skip
def test_bad_activation_modes(fields, match):
    with pytest.raises(ConfigError, match=match):
        QuantizationConfig(**fields)


def test_native_rounds_the_activations_of_every_w8a8_matmul():
    from pace_native import kernels as native

    x = torch.randn(3, 64)
    w = quantize(torch.randn(32, 64), coerce_quantization("w8a8"))
    assert w.activation_group == 64
    want = native.int8_activations(x, None, 64) @ w.dequantize().T
    assert torch.equal(native.matmul(x, w), want)
    assert torch.equal(native.linear(x, native.prepare_linear(w)), want)
    gate_up = native.prepare_gated_mlp(w, w, quantize(torch.randn(64, 32), QuantizationConfig(
        bits=8, activations="int8")), "silu")  # fmt: skip
    assert isinstance(gate_up.gate_up, QuantizedWeight) and gate_up.gate_up.activations == "int8"


def model_logits(path, opconfig: dict, quantization: str) -> torch.Tensor:
    model = LLMModel(path, dtype=torch.float32, quantization=quantization, load_tokenizer=False,
                     opconfig=opconfig, kv_cache_type="dynamic")  # fmt: skip
    ids = torch.randint(3, 150, (2, 24), generator=torch.Generator().manual_seed(0))
    return model.logits(ids).float().log_softmax(-1)


@pytest.mark.skipif(not detect_cpu().has("avx512f", "avx512_vnni"), reason="needs AVX512-VNNI")
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding", "gemma3"])
@pytest.mark.parametrize("stack", ["avx512", "native"])
def test_avx512_w8a8_kernels_agree_with_native(family, stack, tmp_path):
    """fp32, the fused decoder stack and the per-layer kernels."""
    pytest.importorskip("pace_avx512")
    path = FACTORIES[family](tmp_path)
    want = model_logits(path, {"default": "native"}, "w8a8")
    got = model_logits(path, {"default": "avx512", "decoder_stack": stack}, "w8a8")
    assert (want.exp() * (want - got)).sum(-1).max() <= 1e-5
    dense = model_logits(path, {"default": "native"}, "int8-channel")
    assert not torch.equal(dense, want)  # the activations do round
