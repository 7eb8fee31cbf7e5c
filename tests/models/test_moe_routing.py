"""MoE routing equals transformers': for every token of a prompt, each sparse layer of pace
chooses the same experts with the same weights as HF's router, given HF's own layer input."""

from __future__ import annotations

import pytest
import torch
from support.tiny import FACTORIES
from transformers import AutoModelForCausalLM

from pace_core.engine.llm import LLMModel
from pace_core.models.moe import MoE


@pytest.mark.parametrize("variant", ["qwen3-moe"])
def test_same_experts_and_weights_as_transformers(variant, tmp_path):
    path = FACTORIES[variant](tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pace = LLMModel(path, dtype=torch.float32, load_tokenizer=False).model
    seen: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def capture(i):
        def hook(module, args, output):
            _, weights, chosen = output
            seen[i] = (args[0].detach(), chosen, weights.detach())

        return hook

    sparse = [i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "gate")]
    for i in sparse:
        hf.model.layers[i].mlp.gate.register_forward_hook(capture(i))
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        hf(ids)
    assert sparse and set(seen) == set(sparse)
    for i in sparse:
        moe = pace.layers[i].mlp
        assert isinstance(moe, MoE)
        x, hf_chosen, hf_weights = seen[i]
        chosen, weights = moe.route(x.reshape(-1, x.shape[-1]))
        order_hf, order_pace = hf_chosen.sort(-1), chosen.sort(-1)
        assert torch.equal(order_pace.values, order_hf.values), f"layer {i}: other experts"
        got = weights.gather(-1, order_pace.indices)
        want = hf_weights.gather(-1, order_hf.indices)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
