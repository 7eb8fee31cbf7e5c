"""The text part of multimodal checkpoints (Gemma 3, Gemma 4, Llama 4 ForConditionalGeneration)
against transformers, and MXFP4 expert de-quantization."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from support.tiny import gemma3_conditional, gemma4_conditional, llama4_conditional
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from pace_core import LLMModel
from pace_core.models.mxfp4 import dequantize_mxfp4

MULTIMODAL = {
    "gemma3": (gemma3_conditional, tf.Gemma3ForConditionalGeneration),
    "gemma4": (gemma4_conditional, tf.Gemma4ForConditionalGeneration),
    "llama4": (llama4_conditional, tf.Llama4ForConditionalGeneration),
}


@pytest.mark.parametrize("family", list(MULTIMODAL))
def test_conditional_generation_text_part(tmp_path, family):
    factory, model_cls = MULTIMODAL[family]
    model = model_cls.from_pretrained(factory(tmp_path)).eval()
    gen = torch.Generator().manual_seed(0)  # ids from 1: Gemma 4 masks its pad id 0 as an image
    ids = torch.randint(1, 160, (1, 12), generator=gen)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    pace = LLMModel(tmp_path, dtype=torch.float32, load_tokenizer=False, quiet=True)
    assert (pace.logits(ids) - ref).abs().max() < 1e-4


def test_mxfp4_dequantization_matches_transformers():
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 6, 3, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 134, (2, 6, 3), generator=gen, dtype=torch.uint8)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    got = dequantize_mxfp4(blocks, scales, torch.float32)
    assert got.shape == want.shape == (2, 96, 6)
    assert torch.equal(got, want)
