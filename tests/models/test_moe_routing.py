"""MoE routing equals transformers': for every token of a prompt, each sparse layer of pace
chooses the same experts with the same weights as HF's router, given HF's own layer input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from support.tiny import FACTORIES
from transformers import AutoModelForCausalLM

from pace_core.engine.llm import LLMModel
from pace_core.models.moe import MoE


def _qwen3_router(layer) -> tuple[torch.nn.Module | None, Callable]:
    """Qwen3-MoE's ``mlp.gate`` returns (logits, weights [N, k], chosen [N, k])."""
    return getattr(layer.mlp, "gate", None), lambda out: (out[2], out[1])


def _llama4_router(layer) -> tuple[torch.nn.Module | None, Callable]:
    """Llama 4's ``feed_forward.router`` returns (scores [N, E]: 0 off the top-k, logits)."""
    k = layer.feed_forward.router.top_k if hasattr(layer.feed_forward, "router") else 0

    def read(out):
        weights, chosen = out[0].topk(k, dim=-1)
        return chosen, weights

    return getattr(layer.feed_forward, "router", None), read


def _gemma4_router(layer) -> tuple[torch.nn.Module | None, Callable]:
    """Gemma 4's ``router`` (beside the dense MLP) returns (probs, weights, chosen)."""
    return getattr(layer, "router", None), lambda out: (out[2], out[1])


def _gpt_oss_router(layer) -> tuple[torch.nn.Module | None, Callable]:
    """GPT-OSS's ``mlp.router`` returns (logits, weights [N, k], chosen [N, k])."""
    return layer.mlp.router, lambda out: (out[2], out[1])


# DeepSeek-V3's ``mlp.gate`` returns what Qwen3-MoE's does
ROUTERS = {"qwen3-moe": _qwen3_router, "llama4": _llama4_router, "deepseek-v3": _qwen3_router,
           "gemma4": _gemma4_router, "gpt-oss": _gpt_oss_router}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(ROUTERS))
def test_same_experts_and_weights_as_transformers(variant, tmp_path):
    path = FACTORIES[variant](tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pace = LLMModel(path, dtype=torch.float32, load_tokenizer=False).model
    seen: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def capture(i, read):
        def hook(module, args, output):
            chosen, weights = read(output)
            seen[i] = (args[0].detach(), chosen, weights.detach())

        return hook

    routers = {i: ROUTERS[variant](layer) for i, layer in enumerate(hf.model.layers)}
    sparse = [i for i, (module, _) in routers.items() if module is not None]
    for i in sparse:
        module, read = routers[i]
        module.register_forward_hook(capture(i, read))
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        hf(ids)
    assert sparse and set(seen) == set(sparse)
    for i in sparse:
        moe = getattr(pace.layers[i], "moe", None) or pace.layers[i].mlp  # Gemma 4: beside
        assert isinstance(moe, MoE)
        x, hf_chosen, hf_weights = seen[i]
        chosen, weights = moe.route(x.reshape(-1, x.shape[-1]))
        order_hf, order_pace = hf_chosen.sort(-1), chosen.sort(-1)
        assert torch.equal(order_pace.values, order_hf.values), f"layer {i}: other experts"
        got = weights.gather(-1, order_pace.indices)
        want = hf_weights.gather(-1, order_hf.indices)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
